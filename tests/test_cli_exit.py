"""The `launcher` command leaves without the interpreter's teardown (cli._leave, then cli._last_exit, the last
exit function): its exit code, its whole output and its exit functions are still those of a normal exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _launcher(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    marker = tmp_path / "exit-functions-ran"
    code = (
        "import atexit, sys, tempfile, pathlib\n"
        "from launcher.cli import main\n"
        f"atexit.register(lambda: pathlib.Path({str(marker)!r}).write_text('yes'))\n"
        f"kept = tempfile.TemporaryDirectory(dir={str(tmp_path)!r})  # removed by its finalizer at exit\n"
        f"sys.argv = ['launcher', *{list(args)!r}]\n"
        "main()\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"})


def test_a_success_a_usage_error_and_a_launcher_error_keep_their_exit_codes(tmp_path: Path) -> None:
    assert _launcher(tmp_path, "--version").returncode == 0
    assert _launcher(tmp_path, "--no-such-option").returncode == 2
    done = _launcher(tmp_path, "-w", str(tmp_path / "none"), "ps")
    assert done.returncode not in (0, 1, 2) and "error:" in done.stderr  # launcher's own exit code and line


def test_the_whole_output_is_flushed_and_exit_functions_and_finalizers_run(tmp_path: Path) -> None:
    done = _launcher(tmp_path, "run", "--help")
    assert done.returncode == 0
    assert done.stdout.rstrip().endswith("╯") and "--determinism" in done.stdout  # the last panel, closed
    assert (tmp_path / "exit-functions-ran").read_text() == "yes"
    assert [p.name for p in tmp_path.iterdir()] == ["exit-functions-ran"]  # the temporary folder went


def test_importing_the_cli_registers_one_exit_function_so_every_other_runs_before_it() -> None:
    # the interpreter runs exit functions last registered first: one registered while launcher.cli is
    # imported, before _last_exit, would be skipped by its os._exit (atexit.register watched here)
    code = ("import atexit\n"
            "seen = []\n"
            "register = atexit.register\n"
            "atexit.register = lambda f, *a, **k: (seen.append(getattr(f, '__qualname__', repr(f))), "
            "register(f, *a, **k))[1]\n"
            "import launcher.cli\n"
            "print(seen)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                          check=True)
    assert done.stdout.split("\n")[-2] == "['_last_exit']"


def test_the_interpreters_teardown_is_skipped_and_importing_alone_changes_nothing(tmp_path: Path) -> None:
    torn = "class Torn:\n    def __del__(self):\n        print('torn down', flush=True)\nkept = Torn()\n"
    ran = subprocess.run([sys.executable, "-c", torn + "import sys\nsys.argv = ['launcher', '--version']\n"
                          "from launcher.cli import main\nmain()\n"], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert ran.returncode == 0 and "launcher " in ran.stdout and "torn down" not in ran.stdout
    imported = subprocess.run([sys.executable, "-c", torn + "import launcher.cli\nraise SystemExit(3)\n"],
                              capture_output=True, text=True, cwd=REPO, timeout=120)
    assert imported.returncode == 3 and "torn down" in imported.stdout  # a script that only imports it
