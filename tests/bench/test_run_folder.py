"""Scenario runs keep their server logs bounded: this run's folder and the previous one's."""

from __future__ import annotations

from bench.perf.servers import run_folder


def test_each_run_replaces_the_one_before_the_previous(tmp_path):
    for run in range(1, 4):
        folder = run_folder(tmp_path / "logs", "throughput")
        assert list(folder.iterdir()) == []  # nothing of an earlier run left in it
        (folder / "naiad.log").write_text(f"run {run}")
        (folder / "naiad-cache").mkdir()
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["throughput", "throughput.prev"]
    assert (tmp_path / "logs" / "throughput" / "naiad.log").read_text() == "run 3"
    assert (tmp_path / "logs" / "throughput.prev" / "naiad.log").read_text() == "run 2"
    run_folder(tmp_path / "logs", "peers")  # another scenario's runs are its own
    assert (tmp_path / "logs" / "throughput" / "naiad.log").read_text() == "run 3"
