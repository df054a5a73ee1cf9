"""launcher base bootstrap takes the base's Python from the image it made, not from a table of suites."""

from __future__ import annotations

import pytest

from launcher.errors import BuildFailed
from launcher.images import bootstrap


def test_python_is_read_from_the_probe_of_any_suite() -> None:
    assert bootstrap.probed_python("launcher-python 3.13\n", "r/launcher-base:trixie", bootstrap.BASE_PACKAGES) \
        == "3.13"
    # a suite no table knows (forky, sid) is fine: the image says what it runs
    assert bootstrap.probed_python("some warning\nlauncher-python 3.14\n", "r/b:forky", ()) == "3.14"


def test_an_image_without_python_is_a_clear_build_failure() -> None:
    out = 'docker: Error response from daemon: exec: "python3": executable file not found in $PATH\n'
    with pytest.raises(BuildFailed) as err:
        bootstrap.probed_python(out, "r/launcher-base:trixie", ("ca-certificates",))
    assert "r/launcher-base:trixie has no working python3" in err.value.message
    assert "executable file not found" in err.value.message
    assert "include python3 in the packages (they were: ca-certificates)" in str(err.value.hint)
