"""Where parity's writes land: a stream, a FIFO, a link, a file parity did not write (docs/security.md, "Files").

Each test was written against a way parity once lost a user's file: `--json /dev/stderr 2>>build.log`
renamed a new file over the log; a dump's symlink to a golden file overwrote the golden; a library's own
rename replaced a FIFO with a regular file; closing the writability check's descriptor ended a FIFO
reader's input; an export through a symlinked fixture directory deleted the files it pointed to; `parity
seal` rewrote a manifest shared through a link; SIGTERM left a staging directory behind. Most run in
process; the CLI ones run `parity` as a user would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from parity_harness._core.errors import FixtureError, ParityError
from parity_harness._core.output_paths import check_output_paths, written_by_parity
from parity_harness._core.safe_write import (
    WriteError,
    check_target,
    replace_directory,
    staging_directory,
    write_atomic_with,
    write_text_atomic,
)
from tests.helpers import REPO, TOY, run_cli

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")
needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd (Linux)")


# -- streams: one of parity's own open files ---------------------------------------------------------


@needs_proc
@pytest.mark.parametrize("spelling", ["/proc/self/fd/{fd}", "/dev/fd/{fd}"])
def test_a_stream_is_written_through_its_descriptor_never_renamed_over(tmp_path: Path, spelling: str) -> None:
    """`--json /dev/stderr 2>>build.log`: the log keeps its lines and gets the report after them."""
    log = tmp_path / "build.log"
    log.write_text("line 1 of my build log\n")
    inode = log.stat().st_ino
    with open(log, "a") as stream:  # as a shell's 2>>build.log
        target = Path(spelling.format(fd=stream.fileno()))
        check_target(target, "JSON report")
        write_text_atomic(target, '{"the": "report"}\n', "JSON report")
    assert log.read_text() == 'line 1 of my build log\n{"the": "report"}\n'
    assert log.stat().st_ino == inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build.log"]


@needs_proc
def test_a_link_to_a_stream_is_a_stream(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_text("kept\n")
    with open(log, "a") as stream:
        (tmp_path / "out.json").symlink_to(f"/proc/self/fd/{stream.fileno()}")
        write_atomic_with(tmp_path / "out.json", lambda tmp: tmp.write_text("new\n"), "JSON report")
    assert log.read_text() == "kept\nnew\n"


@needs_proc
def test_a_descriptor_open_only_for_reading_is_refused_before_any_work(tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("read only")
    with open(data) as stream, pytest.raises(WriteError, match="not open for writing"):
        check_target(Path(f"/proc/self/fd/{stream.fileno()}"), "JSON report")
    assert data.read_text() == "read only"


@needs_proc
def test_another_process_s_descriptor_is_refused() -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.PIPE)
    try:
        with pytest.raises(WriteError, match="leads through /proc"):
            check_target(Path(f"/proc/{other.pid}/fd/1"), "JSON report")
        with pytest.raises(WriteError, match="leads through /proc"):
            write_text_atomic(Path(f"/proc/{other.pid}/fd/1"), "x", "JSON report")
    finally:
        other.kill()
        other.wait()


# -- FIFOs and devices: opened as they are -----------------------------------------------------------


def _reader(fifo: Path, got: list[bytes]) -> threading.Thread:
    def read() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _check_once_read(fifo: Path) -> None:
    """`check_target` once the reader thread has the FIFO open (it keeps the descriptor for the write)."""
    for _ in range(500):
        try:
            check_target(fifo, "dump")
            return
        except WriteError:  # no reader yet
            time.sleep(0.01)
    raise AssertionError("the reader never opened the FIFO")


@needs_fifo
def test_a_fifo_s_reader_gets_the_whole_report_and_no_early_end(tmp_path: Path) -> None:
    """The check proves a reader (opening the FIFO); closing that descriptor would end the reader's input
    before the report is written. The check keeps it, and the write uses it."""
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    got: list[bytes] = []
    thread = _reader(fifo, got)
    _check_once_read(fifo)
    thread.join(0.5)
    assert thread.is_alive() and not got, "the reader saw the end of its input before the report"
    write_text_atomic(fifo, "the whole report\n", "JSON report")
    thread.join(10)
    assert got == [b"the whole report\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@needs_fifo
def test_a_library_that_renames_its_own_file_never_replaces_a_fifo(tmp_path: Path) -> None:
    """safetensors writes a temporary file and renames it over the path it is given: given a FIFO's (or
    /dev/null's) path, it would replace it with a regular file. It gets a private path instead."""
    fifo = tmp_path / "dump.safetensors"
    os.mkfifo(fifo)
    got: list[bytes] = []
    thread = _reader(fifo, got)
    _check_once_read(fifo)

    def renaming_library(path: Path) -> None:
        tmp = path.with_name(path.name + ".lib-tmp")
        tmp.write_bytes(b"the dump's bytes")
        os.replace(tmp, path)

    write_atomic_with(fifo, renaming_library, "dump")
    thread.join(10)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a regular file"
    assert b"".join(got).endswith(b"the dump's bytes")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dump.safetensors"]


@needs_fifo
def test_a_fifo_nobody_reads_is_refused_never_waited_for(tmp_path: Path) -> None:
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    with pytest.raises(WriteError, match="a FIFO nobody reads"):
        check_target(fifo, "JSON report")
    with pytest.raises(WriteError, match="a FIFO nobody reads"):
        write_text_atomic(fifo, "x", "JSON report")


def test_the_check_leaves_nothing_behind_and_refuses_a_directory(tmp_path: Path) -> None:
    check_target(tmp_path / "new.json", "JSON report")
    (tmp_path / "old.json").write_text("old")
    check_target(tmp_path / "old.json", "JSON report")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]
    assert (tmp_path / "old.json").read_text() == "old"
    with pytest.raises(WriteError, match="it is a directory"):
        check_target(tmp_path, "JSON report")
    with pytest.raises(WriteError, match="cannot write the JSON report"):
        check_target(tmp_path / "old.json" / "under-a-file.json", "JSON report")


def test_a_writable_file_in_a_directory_that_takes_no_new_file_is_refused_before_any_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write renames a temporary file into the directory: a writable file alone is not enough. (The
    directory refuses new files by a patched `os.open`: root, as CI runs, writes into a read-only one.)"""
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "r.json").write_text('{"schema": "parity-report"}')
    real_open = os.open

    def refusing_open(path: str | os.PathLike[str], flags: int, *args: int, **kwargs: int) -> int:
        if flags & os.O_CREAT and Path(path).parent == ro:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    with pytest.raises(WriteError, match=r"r.json: cannot write the JSON report \(Permission denied\)"):
        check_target(ro / "r.json", "JSON report")
    assert sorted(p.name for p in ro.iterdir()) == ["r.json"]


# -- files parity did not write ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "content"), [
    ("r.json", '{\n "schema": "parity-report",\n "usable": true\n}\n'),
    ("s.json", '{\n "schema": "parity-selftest"\n}\n'),
    ("r.xml", "<?xml version='1.0' encoding='utf-8'?>\n<testsuites name=\"parity\" tests=\"1\">"),
    ("r.md", "## parity\n\nFixture `fixtures/toy`.\n"),
    ("r.txt", "parity: fixture fixtures/toy\nnumpy  fp32 ...\n"),
    ("empty.json", ""),
], ids=["json-report", "selftest-json", "junit", "markdown", "text", "empty"])
def test_a_file_parity_wrote_may_be_replaced(tmp_path: Path, name: str, content: str) -> None:
    (tmp_path / name).write_text(content)
    assert written_by_parity(tmp_path / name)
    check_output_paths({"--json": str(tmp_path / name)})


@pytest.mark.parametrize(("name", "content"), [
    ("thesis.txt", "Chapter 1\n"),
    ("r.json", '{"schema": "someone-else", "parity": 1}'),
    ("r.xml", "<?xml version='1.0'?>\n<testsuites name=\"pytest\">"),
    ("r.md", "# My notes on parity\n"),
    ("pic.png", "\x89PNG\r\n\x1a\n not ours"),
], ids=["text", "other-json", "other-junit", "other-markdown", "other-png"])
def test_a_file_parity_did_not_write_is_refused_and_kept(tmp_path: Path, name: str, content: str) -> None:
    (tmp_path / name).write_bytes(content.encode("latin-1"))
    option = "--plot" if name.endswith(".png") else "--json"
    with pytest.raises(ParityError, match="is not a file parity wrote; parity never overwrites"):
        check_output_paths({option: str(tmp_path / name)})
    assert (tmp_path / name).read_bytes() == content.encode("latin-1")


def test_pictures_carry_the_mark_that_lets_a_later_run_replace_them(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="pictures need parity-harness[plot]")
    from parity_harness import api
    from parity_harness._fixture.fixture import load_fixture
    from parity_harness._views.plots import plot_error_ladder

    fixture = load_fixture(str(TOY))
    report = api.run("numpy", fixture, "fp32", decoding=False)
    for name in ("ladder.png", "ladder.svg"):
        plot_error_ladder(report, fixture, tmp_path / name)
        assert written_by_parity(tmp_path / name), name
        check_output_paths({"--plot": str(tmp_path / name)})


# -- directories and the manifest ---------------------------------------------------------------------


def test_replacing_a_directory_through_a_symlink_replaces_what_it_points_to_and_deletes_nothing_else(
        tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "a.bin").write_text("old a")
    (tmp_path / "link").symlink_to("real")
    with staging_directory(tmp_path / "link") as staging:
        (staging / "a.bin").write_text("new a")
        replace_directory(staging, tmp_path / "link", owned=["a.bin"])
    assert (tmp_path / "link").is_symlink()
    assert (real / "a.bin").read_text() == "new a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


def test_seal_refuses_a_manifest_linked_from_outside_the_fixture(tmp_path: Path) -> None:
    from parity_harness._authoring.fixture_writer import seal_manifest

    fixture = tmp_path / "a"
    shutil.copytree(TOY, fixture)
    shared = tmp_path / "shared.json"
    shutil.move(fixture / "manifest.json", shared)
    (fixture / "manifest.json").symlink_to(shared)
    before = shared.read_bytes()
    with pytest.raises(FixtureError, match="outside the fixture directory"):
        seal_manifest(fixture, rehash_files=True)
    assert shared.read_bytes() == before


# -- the reference's training script --------------------------------------------------------------------


def test_training_refuses_to_write_into_a_fixture_before_it_trains(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                                   ) -> None:
    from parity_reference import train_tiny

    fixture = tmp_path / "toy"
    shutil.copytree(TOY, fixture)
    before = {p.name: p.read_bytes() for p in fixture.iterdir()}
    with pytest.raises(SystemExit) as exit_info:
        train_tiny.main(["--steps", "1", "--jobs", "1", "--quiet", "--out", str(fixture)])
    assert exit_info.value.code == 2
    assert "is a fixture directory" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in fixture.iterdir()} == before
    with pytest.raises(SystemExit):
        train_tiny.main(["--steps", "1", "--jobs", "1", "--quiet", "--json", str(tmp_path / "no" / "r.json")])
    assert "its directory does not exist" in capsys.readouterr().err


# -- the command line -------------------------------------------------------------------------------------


@pytest.mark.full
def test_save_outputs_never_writes_through_a_link_or_over_a_file_it_did_not_write(tmp_path: Path) -> None:
    fixture = tmp_path / "toy"
    shutil.copytree(TOY, fixture)
    golden = (fixture / "golden.fp32.safetensors").read_bytes()
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "numpy.fp32.safetensors").symlink_to(fixture / "golden.fp32.safetensors")
    args = ("run", "--fixture", str(fixture), "--backends", "numpy", "--precision", "fp32", "-q", "--save-outputs",
            str(dumps))
    proc = run_cli(*args)
    assert proc.returncode == 2 and "is a symbolic link" in proc.stderr, proc.stderr
    assert (fixture / "golden.fp32.safetensors").read_bytes() == golden
    (dumps / "numpy.fp32.safetensors").unlink()
    (dumps / "numpy.fp32.safetensors").write_text("my own file")
    proc = run_cli(*args)
    assert proc.returncode == 2 and "is not a parity dump" in proc.stderr, proc.stderr
    assert (dumps / "numpy.fp32.safetensors").read_text() == "my own file"
    (dumps / "numpy.fp32.safetensors").unlink()
    assert run_cli(*args).returncode == 0
    assert run_cli(*args).returncode == 0, "a run may replace the dump an earlier run wrote"


@pytest.mark.full
@needs_proc
def test_json_to_dev_stderr_appends_to_the_redirected_log(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_text("line 1 of my build log\n")
    with open(log, "a") as stderr:
        proc = subprocess.run([sys.executable, "-m", "parity_harness", "run", "--backends", "numpy", "--precision",
                               "fp32", "-q", "--json", "/dev/stderr"], stdout=subprocess.DEVNULL, stderr=stderr,
                              cwd=REPO, timeout=600)
    assert proc.returncode == 0
    text = log.read_text()
    assert text.startswith("line 1 of my build log\n")
    report = json.loads(text[text.index("{"):])
    assert report["schema"] == "parity-report" and report["passed"] is True


@pytest.mark.full
def test_sigterm_is_an_interrupt_that_cleans_up(tmp_path: Path) -> None:
    """A cancelled CI job: exit 130, and `--json` says the run is unusable (never an earlier run's PASS)."""
    report = tmp_path / "r.json"
    report.write_text('{"schema": "parity-report", "usable": true, "passed": true}')  # an earlier run's
    proc = subprocess.Popen([sys.executable, "-m", "parity_harness", "run", "--json", str(report), "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
    time.sleep(3)  # importing, loading, or running: the handler is installed before any of them
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "parity: interrupted" in err and "Traceback" not in err
    marker = json.loads(report.read_text())
    assert marker["usable"] is False and marker["exit_code"] == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
