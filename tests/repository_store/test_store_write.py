"""The one-pass listing (fingerprints), whole-model listing and writes, on both stores."""

from __future__ import annotations

import pathlib

from rs_helpers import ALL_MODELS

from repository_store import RepositoryStore


def test_fingerprints_cover_every_model_in_one_listing(store: RepositoryStore) -> None:
    prints = store.fingerprints()
    assert sorted(prints) == ALL_MODELS == store.list_models()
    assert len(set(prints.values())) == len(prints)  # different folders, different prints
    assert store.fingerprints() == prints  # stable while nothing changes


def test_fingerprint_changes_only_for_the_changed_model(
    store: RepositoryStore, tmp_path: pathlib.Path
) -> None:
    before = store.fingerprints()
    source = tmp_path / "model.onnx"
    source.write_bytes(b"version four")
    store.put_file("simple", "4/model.onnx", source)
    after = store.fingerprints()
    assert {n for n in after if after[n] != before.get(n)} == {"simple"}

    store.put_file("fresh", "1/model.onnx", source)
    store.make_folder("fresh", "2")
    again = store.fingerprints()
    assert {n for n in again if again[n] != after.get(n)} == {"fresh"}
    assert store.list_versions("fresh") == [1, 2]


def test_put_file_reports_progress_and_lists(store: RepositoryStore, tmp_path: pathlib.Path) -> None:
    source = tmp_path / "labels.txt"
    source.write_bytes(b"a\nb\n" * 1000)
    seen: list[int] = []
    store.put_file("simple", "labels.txt", source, seen.append)
    assert sum(seen) == 4000
    assert store.read_model_file("simple", "labels.txt") == source.read_bytes()
    files = {f.path: f.size for f in store.list_model_files("simple")}
    assert files["labels.txt"] == 4000 and files["config.pbtxt"] > 0
    assert files["3/extra/data.bin"] == 10
    assert store.list_model_files("absent") == []
