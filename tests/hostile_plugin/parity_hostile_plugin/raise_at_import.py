"""A plugin module that raises a BaseException subclass while it is being imported."""


class ImportBoom(BaseException):
    pass


raise ImportBoom("the plugin blew up at import")
