"""parity never loses or corrupts a user's file, never writes over its inputs, reads inputs bounded, and
reports a user's mistake as one line naming it (docs/security.md, "Files").

Every case runs `parity` as a user would (a subprocess) on `tmp_path` copies of `fixtures/toy`, and
checks the exit code, exactly one `parity: error:` line, no traceback, and that no file under
`tmp_path` changed (a hash of the whole tree before and after). Case ids start with their class:
`write-` (what parity writes: atomically, never over what it did not write), `input-` (an output
that is an input), `read-` (what parity reads: names checked first, regular files, under the caps),
`arg-` (a user's mistake is not an "internal error").
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import shutil
import signal
import stat
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from parity_harness._core.input_files import MAX_DUMP_HEADER_BYTES, MAX_MANIFEST_BYTES, MAX_REPORT_BYTES
from parity_harness._core.safe_write import (
    TMP_MARK,
    WriteError,
    replace_directory,
    staging_directory,
    write_atomic_with,
)
from tests.helpers import REPO, TOY, assert_exit_2_one_line, edit_manifest, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

STRESS = REPO / "fixtures" / "toy-stress"
# Longer than any file name a file system takes (255 bytes); relative (to the repository, where the CLI
# runs), so the one line naming it stays under the 400 characters a message is cut to. Nothing can be created.
LONG = "n" * 256


def tree_hash(root: Path) -> dict[str, str]:
    """Every entry under `root`: its relative path -> its kind and content hash (a symlink: its target)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = f"link {os.readlink(path)}"
            elif stat.S_ISREG(st.st_mode):
                out[rel] = f"file {hashlib.sha256(path.read_bytes()).hexdigest()} {stat.S_IMODE(st.st_mode):o}"
            else:
                out[rel] = f"mode {stat.S_IFMT(st.st_mode):o}"
    return out


def assert_refused_unchanged(tmp_path: Path, run: Callable[[], subprocess.CompletedProcess[str]],
                             *needles: str) -> None:
    """Run `run`, then: exit 2, one line holding `needles`, no traceback, nothing under tmp_path changed."""
    before = tree_hash(tmp_path)
    proc = run()
    assert_exit_2_one_line(proc, *needles)
    assert "internal error" not in proc.stderr, proc.stderr
    after = tree_hash(tmp_path)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert not changed, f"files changed by a refused command: {changed[:5]}"


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    dst = tmp_path / "toy"
    shutil.copytree(TOY, dst)
    return dst


@pytest.fixture
def stress(tmp_path: Path) -> Path:
    dst = tmp_path / "toy-stress"
    shutil.copytree(STRESS, dst)
    return dst


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run's dump (numpy fp64) and JSON report, to compare and merge (read-only: copy before use)."""
    root = tmp_path_factory.mktemp("outputs")
    proc = run_cli("run", "--backends", "numpy", "--precision", "fp64", "-q", "--json", str(root / "r.json"),
                   "--save-outputs", str(root / "dumps"))
    assert proc.returncode == 0, proc.stderr[-1500:]
    return root


def _no_xfsz() -> None:  # the child: a write past the limit fails with EFBIG (a full disk, for one process)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def run_with_small_disk(*args: str) -> subprocess.CompletedProcess[str]:
    """`parity ARGS` where no file may grow past 4 kB: every write of more fails, as on a full disk."""
    return subprocess.run([sys.executable, "-m", "parity_harness", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, preexec_fn=_no_xfsz)


# -- write: atomic, and never over what parity did not write ----------------------------------------------


def test_write_export_into_a_directory_that_is_not_a_fixture_refuses_and_keeps_it(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    assert_refused_unchanged(tmp_path, lambda: run_cli("export", "--fixture", str(mine), "--steps", "1"),
                             f"--fixture {mine}", "not a toy fixture", "no manifest.json")


def test_write_export_stress_into_a_directory_that_is_not_a_fixture_refuses(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert_refused_unchanged(tmp_path, lambda: run_cli("export", "--preset", "toy-stress", "--fixture", str(mine)),
                             "not a toy-stress fixture")


def test_write_export_stress_over_the_toy_refuses(tmp_path: Path, toy: Path) -> None:
    assert_refused_unchanged(tmp_path, lambda: run_cli("export", "--preset", "toy-stress", "--fixture", str(toy),
                                                       "--from", str(TOY)),
                             "not a toy-stress fixture", "it is a toy fixture")


def test_write_export_toy_over_the_stress_fixture_refuses(tmp_path: Path, stress: Path) -> None:
    assert_refused_unchanged(tmp_path, lambda: run_cli("export", "--fixture", str(stress), "--steps", "1"),
                             "it is a toy-stress fixture", "--preset toy-stress")


def test_write_export_over_a_fixture_holding_a_file_it_did_not_write_refuses(tmp_path: Path, toy: Path) -> None:
    (toy / "README.md").write_text("my notes about the toy")
    assert_refused_unchanged(tmp_path, lambda: run_cli("export", "--fixture", str(toy), "--steps", "1"),
                             "holds 'README.md'", "never deletes")


def test_write_decoding_only_with_the_stress_preset_refuses(tmp_path: Path, stress: Path) -> None:
    (tmp_path / "beside.txt").write_text("a file beside the fixture")
    assert_refused_unchanged(tmp_path, lambda: run_cli("export", "--decoding-only", "--preset", "toy-stress",
                                                       "--fixture", str(stress)),
                             "--decoding-only", "does not combine with --preset toy-stress")


def test_write_decoding_only_on_a_stress_fixture_refuses_without_advising_a_rewrite(tmp_path: Path,
                                                                                  stress: Path) -> None:
    def run() -> subprocess.CompletedProcess[str]:
        return run_cli("export", "--decoding-only", "--fixture", str(stress))

    assert_refused_unchanged(tmp_path, run, "a toy-stress fixture", "toy fixtures only")
    assert "pass --preset" not in run().stderr


def test_write_preset_into_a_non_empty_directory_refuses(tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "data.bin").write_bytes(b"\x00" * 10)
    assert_refused_unchanged(tmp_path, lambda: run_cli("export", "--preset", "gpt2-mini", "--fixture",
                                                       str(tmp_path / "busy")), "not an empty directory")


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_write_seal_on_a_full_disk_leaves_the_manifest_as_it_was(tmp_path: Path, toy: Path) -> None:
    edit_manifest(toy, lambda m: m["tolerances"]["fp32"].update(atol=2e-5), seal=False)  # a reviewed edit
    assert_refused_unchanged(tmp_path, lambda: run_with_small_disk("seal", "--fixture", str(toy)),
                             "manifest.json: cannot write the manifest", "File too large")
    assert run_cli("seal", "--fixture", str(toy)).returncode == 0  # and it seals once there is room


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_write_a_report_on_a_full_disk_leaves_a_whole_file_never_a_truncated_one(tmp_path: Path) -> None:
    """The report does not fit: no truncated JSON. What the path then holds is the small unusable marker
    (docs/reports.md: a run that ends in exit 2 must not leave an earlier report that merge would take for
    its own), written whole, and no temporary file is left beside it."""
    (tmp_path / "r.json").write_text('{"schema": "parity-report", "previous": "report"}')  # an earlier run's
    proc = run_with_small_disk("run", "--backends", "numpy", "--precision", "fp64", "-q", "--json",
                               str(tmp_path / "r.json"))
    assert proc.returncode == 2, (proc.stdout[-500:], proc.stderr[-1500:])
    lines = proc.stderr.splitlines()  # the verdict was printed; the report could not be written: one line, exit 2
    assert len(lines) == 1 and "cannot write the JSON report (File too large)" in lines[0], lines
    assert "Traceback" not in proc.stderr
    marker = json.loads((tmp_path / "r.json").read_text())
    assert marker["usable"] is False and marker["exit_code"] == 2 and "File too large" in marker["error"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_write_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    target.write_text("the old, complete file")

    def half_then_full(tmp: Path) -> None:
        tmp.write_text("the new fi")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(WriteError, match=r"manifest.json: cannot write the manifest \(No space left on device\)"):
        write_atomic_with(target, half_then_full, "manifest")
    assert target.read_text() == "the old, complete file"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_write_through_a_symlink_replaces_the_file_it_points_to_and_keeps_its_mode(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    real.chmod(0o640)
    (tmp_path / "link.json").symlink_to(real)
    write_atomic_with(tmp_path / "link.json", lambda tmp: tmp.write_text("new"), "JSON report")
    assert (tmp_path / "link.json").is_symlink() and real.read_text() == "new"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="needs /dev/null")
def test_write_to_a_device_writes_to_it_and_never_replaces_it() -> None:
    before = os.stat("/dev/null")
    write_atomic_with(Path("/dev/null"), lambda tmp: tmp.write_text("gone"), "JSON report")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (before.st_ino, before.st_rdev) == (after.st_ino, after.st_rdev)


def test_write_replace_directory_removes_only_the_files_it_owns(tmp_path: Path) -> None:
    target = tmp_path / "fixture"
    target.mkdir()
    (target / "a.bin").write_text("old a")
    (target / "late.txt").write_text("appeared after the check")
    with staging_directory(target) as staging:
        (staging / "a.bin").write_text("new a")
        with pytest.raises(WriteError, match=r"late\.txt, which parity did not write"):
            replace_directory(staging, target, {"a.bin"})
    assert (target / "a.bin").read_text() == "new a"
    kept = list(tmp_path.rglob("late.txt"))
    assert len(kept) == 1 and kept[0].read_text() == "appeared after the check"
    assert not [p for p in tmp_path.iterdir() if ".parity-stage-" in p.name]


# -- input: an output is never an input of the same command -----------------------------------------------

INPUT_RUN: list[tuple[str, Callable[[Path], list[str]], dict[str, str], tuple[str, ...]]] = [
    ("input-json-is-the-manifest", lambda t: ["--json", str(t / "toy" / "manifest.json")], {},
     ("--json", "inside the fixture directory")),
    ("input-junit-is-a-golden", lambda t: ["--junit", str(t / "toy" / "golden.fp32.safetensors")], {},
     ("--junit", "inside the fixture directory")),
    ("input-markdown-in-the-fixture", lambda t: ["--markdown", str(t / "toy" / "summary.md")], {},
     ("--markdown", "inside the fixture directory")),
    ("input-step-summary-is-the-manifest", lambda t: ["--markdown", str(t / "r.md")],
     {"GITHUB_STEP_SUMMARY": "{tmp}/toy/manifest.json"}, ("$GITHUB_STEP_SUMMARY", "inside the fixture directory")),
    ("input-json-symlink-to-the-manifest", lambda t: ["--json", str(t / "link.json")], {},
     ("--json", "inside the fixture directory")),
    ("input-save-outputs-into-the-fixture", lambda t: ["--save-outputs", str(t / "toy")], {},
     ("--save-outputs", "inside the fixture directory")),
    ("input-json-is-a-dump-it-writes", lambda t: ["--save-outputs", str(t / "d"), "--json",
                                                  str(t / "d" / "numpy.fp64.safetensors")], {},
     ("--json", "is where --save-outputs")),
    ("input-json-empty", lambda t: ["--json", ""], {}, ("--json: an empty path",)),
    ("input-junit-empty", lambda t: ["--junit", ""], {}, ("--junit: an empty path",)),
    ("input-save-outputs-empty", lambda t: ["--save-outputs", ""], {}, ("--save-outputs: an empty path",)),
]


@pytest.mark.parametrize(("case", "args", "env", "needles"), INPUT_RUN, ids=[c[0] for c in INPUT_RUN])
def test_input_a_run_output_that_is_an_input_is_refused(tmp_path: Path, toy: Path, case: str,
                                                        args: Callable[[Path], list[str]], env: dict[str, str],
                                                        needles: tuple[str, ...]) -> None:
    (tmp_path / "link.json").symlink_to(toy / "manifest.json")
    full_env = {k: v.replace("{tmp}", str(tmp_path)) for k, v in env.items()}
    assert_refused_unchanged(tmp_path, lambda: run_cli("run", "--fixture", str(toy), "--backends", "numpy", "-q",
                                                       *args(tmp_path), env=full_env), *needles)


def test_input_compare_never_writes_over_the_dump_it_compares(tmp_path: Path, outputs: Path) -> None:
    dump = tmp_path / "numpy.fp64.safetensors"
    shutil.copyfile(outputs / "dumps" / "numpy.fp64.safetensors", dump)
    assert_refused_unchanged(tmp_path, lambda: run_cli("compare", str(dump), "--junit", str(dump)),
                             "--junit", "a dump being compared")


def test_input_merge_never_writes_over_a_report_it_merges(tmp_path: Path, outputs: Path) -> None:
    report = tmp_path / "r.json"
    shutil.copyfile(outputs / "r.json", report)
    assert_refused_unchanged(tmp_path, lambda: run_cli("merge", str(report), "--json", str(report)),
                             "--json", "a report being merged")


def test_input_selftest_json_in_the_fixture_is_refused(tmp_path: Path, toy: Path) -> None:
    assert_refused_unchanged(tmp_path, lambda: run_cli("selftest", "--fixture", str(toy), "--json",
                                                       str(toy / "manifest.json")),
                             "--json", "inside the fixture directory")


# -- read: names checked before anything is opened; regular files under the caps --------------------------


@pytest.mark.parametrize("name", ["../../etc/passwd", "/dev/zero", "..", "sub/weights.safetensors"],
                         ids=["read-rehash-dotdot", "read-rehash-dev-zero", "read-rehash-parent", "read-rehash-sep"])
def test_read_seal_rehash_checks_names_before_opening_any_file(tmp_path: Path, toy: Path, name: str) -> None:
    edit_manifest(toy, lambda m: m["sha256"].update({name: "0" * 64}), seal=False)
    # Opening /dev/zero (or a FIFO) first would never end: run_cli's timeout, a hang guard, fails the test then.
    assert_refused_unchanged(tmp_path, lambda: run_cli("seal", "--rehash-files", "--fixture", str(toy), timeout=300),
                             "must be a plain name inside the fixture directory")


@pytest.mark.parametrize("target", ["/dev/zero", "outside"], ids=["read-symlink-to-device", "read-symlink-outside"])
def test_read_a_listed_file_that_is_a_symlink_out_of_the_fixture_is_refused(tmp_path: Path, toy: Path,
                                                                            target: str) -> None:
    outside = tmp_path / "outside.safetensors"
    shutil.copyfile(toy / "weights.safetensors", outside)
    (toy / "weights.safetensors").unlink()
    (toy / "weights.safetensors").symlink_to(target if target.startswith("/") else outside)
    for command in (["seal", "--rehash-files"], ["run", "--backends", "numpy", "-q"]):
        assert_refused_unchanged(tmp_path, lambda c=command: run_cli(*c, "--fixture", str(toy), timeout=300),  # type: ignore[misc]
                                 "weights.safetensors")


def _fifo(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_read_merge_and_compare_refuse_a_fifo_instead_of_waiting(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path, "r.json")
    assert_refused_unchanged(tmp_path, lambda: run_cli("merge", str(fifo), timeout=300), "must be a regular file",
                             "a FIFO")
    assert_refused_unchanged(tmp_path, lambda: run_cli("compare", str(fifo), timeout=300), "must be a regular file",
                             "a FIFO")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_read_a_manifest_that_is_a_fifo_is_refused(tmp_path: Path, toy: Path) -> None:
    (toy / "manifest.json").unlink()
    os.mkfifo(toy / "manifest.json")
    assert_refused_unchanged(tmp_path, lambda: run_cli("run", "--fixture", str(toy), timeout=300), "a FIFO")


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_read_merge_dev_zero_is_refused_before_reading(tmp_path: Path) -> None:
    assert_refused_unchanged(tmp_path, lambda: run_cli("merge", "/dev/zero", timeout=300), "/dev/zero", "a device")


def test_read_a_huge_dump_header_is_refused_before_it_is_read(tmp_path: Path) -> None:
    dump = tmp_path / "huge.safetensors"
    n = 97_000_000
    with open(dump, "wb") as f:  # sparse: 97 MB on paper, a few bytes on disk
        f.write(struct.pack("<Q", n) + b"{")
        f.truncate(8 + n)
    peak: list[float] = []
    assert_refused_unchanged(tmp_path, lambda: run_cli_peak(peak, "compare", str(dump)),
                             f"dump header of {n} bytes", f"more than the {MAX_DUMP_HEADER_BYTES}")
    # Reading the header first took 945 MB (and 23 s); memory, unlike time, does not depend on the machine's load.
    assert peak[0] < 400, f"peak RSS {peak[0]:.0f} MB: the header was read before its size was checked"


def run_cli_peak(peak: list[float], *args: str) -> subprocess.CompletedProcess[str]:
    """`run_cli(*args)` through a fresh helper process, whose RUSAGE_CHILDREN is the command's alone: its
    largest resident set, in MB, is appended to `peak`."""
    helper = ("import json, resource, subprocess, sys\n"
              "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
              "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
              "print(json.dumps([p.returncode, p.stdout, p.stderr, peak]))")
    proc = subprocess.run([sys.executable, "-c", helper, sys.executable, "-m", "parity_harness", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=600, check=True)
    code, out, err, maxrss = json.loads(proc.stdout)
    peak.append(maxrss / (2**20 if sys.platform == "darwin" else 2**10))  # bytes on macOS, KiB elsewhere
    return subprocess.CompletedProcess(args, code, out, err)


@pytest.mark.parametrize(("kind", "cap"), [("manifest", MAX_MANIFEST_BYTES), ("report", MAX_REPORT_BYTES)],
                         ids=["read-manifest-over-cap", "read-report-over-cap"])
def test_read_an_input_over_its_cap_is_refused_before_it_is_read(tmp_path: Path, toy: Path, kind: str,
                                                                 cap: int) -> None:
    path = toy / "manifest.json" if kind == "manifest" else tmp_path / "r.json"
    with open(path, "r+b" if path.exists() else "wb") as f:
        f.truncate(cap + 1)  # sparse past the end
    command = ["run", "--fixture", str(toy)] if kind == "manifest" else ["merge", str(path)]
    assert_refused_unchanged(tmp_path, lambda: run_cli(*command, timeout=300),
                             f"the {kind} is {cap + 1} bytes, more than the {cap}")


# -- arg: a user's mistake is one line naming it, never an "internal error" -------------------------------

ARGS: list[tuple[str, Callable[[Path], list[str]], tuple[str, ...]]] = [
    ("arg-seal-missing-fixture", lambda t: ["seal", "--fixture", str(t / "nope")], ("nope", "not found")),
    ("arg-run-fixture-name-too-long", lambda t: ["run", "--fixture", LONG],
     ("cannot read the fixture directory (File name too long)",)),
    ("arg-run-json-name-too-long", lambda t: ["run", "--json", LONG, "--backends", "numpy"],
     ("cannot write the JSON report (File name too long)",)),
    ("arg-export-fixture-name-too-long", lambda t: ["export", "--preset", "gpt2-mini", "--fixture", LONG],
     ("--fixture", "cannot read it (File name too long)")),
    ("arg-seal-name-too-long", lambda t: ["seal", "--fixture", LONG], ("fixture directory not found",)),
    ("arg-serve-port-out-of-range", lambda t: ["serve", "--port", "70000"], ("--port", "0 to 65535", "70000")),
    ("arg-serve-port-not-a-number", lambda t: ["serve", "--port", "http"], ("--port", "'http' is not an integer")),
    ("arg-export-seed-negative", lambda t: ["export", "--preset", "gpt2-mini", "--seed", "-1", "--fixture",
                                            str(t / "new")], ("--seed", "a seed must be 0 to")),
    ("arg-usage-error-is-one-line", lambda t: ["run", "--precision", "fp8"], ("--precision",)),
]


@pytest.mark.parametrize(("case", "args", "needles"), ARGS, ids=[c[0] for c in ARGS])
def test_arg_a_users_mistake_is_one_line_not_an_internal_error(tmp_path: Path, case: str,
                                                               args: Callable[[Path], list[str]],
                                                               needles: tuple[str, ...]) -> None:
    assert_refused_unchanged(tmp_path, lambda: run_cli(*args(tmp_path), timeout=300), *needles)


MALFORMED: list[tuple[str, Callable[[dict], None], tuple[str, ...]]] = [  # type: ignore[type-arg]
    ("arg-merge-max-abs-a-string", lambda d: d["results"][0].update(max_abs="tiny"),
     ("results.max_abs is \"tiny\"", "expected")),
    ("arg-merge-passed-a-number", lambda d: d["taps"][0].update(passed=1), ("taps.passed is 1",)),
    ("arg-merge-decoding-steps-a-string", lambda d: d["decoding"].update(steps="six"), ("decoding.steps",)),
    ("arg-merge-sequences-not-lists", lambda d: d["decoding"].update(sequences={"p": "abc"}),
     ("decoding.sequences",)),
    ("arg-merge-loose-a-number", lambda d: d.update(tolerances_loose=3), ("tolerances_loose is 3",)),
    ("arg-merge-run-seconds-a-string", lambda d: d["runs"][0].update(seconds="fast"), ("runs.seconds",)),
]


@pytest.mark.parametrize(("case", "change", "needles"), MALFORMED, ids=[c[0] for c in MALFORMED])
def test_arg_malformed_merge_fields_are_one_line_naming_the_field(tmp_path: Path, outputs: Path, case: str,
                                                                  change: Callable[[dict], None],  # type: ignore[type-arg]
                                                                  needles: tuple[str, ...]) -> None:
    doc = json.loads((outputs / "r.json").read_text())
    if "decoding" in case and not isinstance(doc.get("decoding"), dict):
        pytest.skip("this run's report has no decoding section")
    change(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert_refused_unchanged(tmp_path, lambda: run_cli("merge", str(bad)), str(bad), "malformed report", *needles)


# -- and what parity does write, it writes -----------------------------------------------------------------


def test_write_seal_rewrites_only_the_manifest_atomically(tmp_path: Path, toy: Path) -> None:
    edit_manifest(toy, lambda m: m["tolerances"]["fp32"].update(atol=2e-5), seal=False)
    (tmp_path / "beside.txt").write_text("untouched")
    before = tree_hash(tmp_path)
    proc = run_cli("seal", "--fixture", str(toy))
    assert proc.returncode == 0, proc.stderr
    after = tree_hash(tmp_path)
    assert sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)) == ["toy/manifest.json"]
    assert not [p for p in toy.iterdir() if TMP_MARK in p.name]


def test_write_fifo_report_without_a_reader_is_refused_not_waited_for(tmp_path: Path) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("needs FIFOs")
    fifo = _fifo(tmp_path, "r.json")
    assert_refused_unchanged(tmp_path, lambda: run_cli("run", "--backends", "numpy", "--json", str(fifo),
                                                       timeout=300), "a FIFO nobody reads")


def test_write_fixture_files_are_not_left_private(tmp_path: Path) -> None:
    import numpy as np

    from parity_harness._authoring.fixture_writer import save_tensors

    umask = os.umask(0o022)
    os.umask(umask)
    save_tensors({"a": np.zeros(3, dtype=np.float32)}, tmp_path / "w.safetensors")  # safetensors writes 0600
    assert stat.S_IMODE((tmp_path / "w.safetensors").stat().st_mode) == 0o666 & ~umask


@pytest.mark.slow
def test_write_export_and_decoding_only_replace_a_toy_fixture_and_nothing_beside_it(tmp_path: Path,
                                                                                   toy: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "beside.txt").write_text("untouched")
    for args in (["export", "--fixture", str(toy), "--steps", "1"],
                 ["export", "--decoding-only", "--fixture", str(toy)]):
        proc = run_cli(*args)
        assert proc.returncode == 0, proc.stderr[-1500:]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["beside.txt", "toy"]  # nothing left beside it
        assert (tmp_path / "beside.txt").read_text() == "untouched"
        assert all(stat.S_IMODE(p.stat().st_mode) & 0o044 for p in toy.iterdir())  # readable by others, as before
    assert run_cli("run", "--fixture", str(toy), "--backends", "numpy", "-q").returncode == 0


def test_a_long_path_does_not_cut_off_the_hint_of_parity_s_own_message(tmp_path: Path) -> None:
    """A fixture deep in a long directory: the one line keeps both the path and the hint at its end."""
    deep = tmp_path / ("d" * 120) / ("e" * 120) / ("f" * 120)
    deep.mkdir(parents=True)
    proc = run_cli("run", "--fixture", str(deep / "missing"), "--backends", "numpy")
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert len(line) > 400 and "\n" not in line, line  # longer than the 400 characters plugin text is cut to
    assert line.endswith("fixture directory not found"), line
