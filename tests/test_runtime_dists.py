"""The runtime's list of installed distributions (runner.distributions) is importlib.metadata's, read without it."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from launcher.runtime.runner import distributions


def _reference(path: list[str] | None = None) -> set[str]:
    found = metadata.distributions(path=path) if path is not None else metadata.distributions()
    return {f"{(d.metadata['Name'] or '?').lower()}=={d.metadata['Version']}" for d in found}


def test_this_interpreters_distributions_are_importlib_metadatas() -> None:
    mine = distributions()
    assert len(mine) > 20
    assert mine == _reference()


def test_every_kind_of_metadata_folder_reads_as_importlib_metadata_reads_it(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "Plain-1.0.dist-info").mkdir()
    (site / "Plain-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: Plain_Pkg\nVersion: 1.0\nSummary: a\n  folded summary\n\nName: not-a-header\n")
    (site / "old.egg-info").mkdir()
    (site / "old.egg-info" / "PKG-INFO").write_text("Metadata-Version: 1.0\nName: Old\nVersion: 0.3.post1\n")
    (site / "single-2.egg-info").write_text("Metadata-Version: 1.1\nName: single\nVersion: 2\n")
    (site / "UPPER-4.DIST-INFO").mkdir()
    (site / "UPPER-4.DIST-INFO" / "METADATA").write_text("Name: Upper\nVersion: 4\n")
    (site / "plain_module.py").write_text("")
    path = [str(site), str(tmp_path / "missing")]
    mine = distributions(path)
    assert mine == _reference(path)
    assert {"plain_pkg==1.0", "old==0.3.post1", "single==2"} <= mine


def test_a_metadata_folder_without_its_file_counts_as_the_standard_library_counts_it(tmp_path: Path) -> None:
    (tmp_path / "broken-3.dist-info").mkdir()  # importlib.metadata: an empty message, no name, no version
    assert distributions([str(tmp_path)]) == {"?==None"}
