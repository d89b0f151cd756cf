"""The worker's side of the capture contract (crates/aerie-capture/src/contract.rs): it writes
the metadata aerie passes (`--metadata`), whatever the target directory holds, asserts only what
its engine reports, and refuses to start an engine without its own requirements."""

from __future__ import annotations

import json
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aerie_capture import worker  # noqa: E402
from aerie_capture.engines import CaptureOutput, Engine, TargetInfo  # noqa: E402
from aerie_capture.shards import Metadata, ShardDataset, Teacher  # noqa: E402

H, LAYERS, VOCAB = 8, 6, 64


class FakeEngine(Engine):
    """An engine whose rows are a function of the token ids, that records what it was asked."""

    def __init__(self, aux, teacher, info=TargetInfo(LAYERS, H, VOCAB, "LlamaForCausalLM")):
        self.info = info
        self.aux_layers = list(aux)
        self.teacher = teacher
        self.description = "fake engine"
        self.shut = False

    def capture(self, batch):
        outs = []
        for ids in batch:
            t = torch.tensor(ids, dtype=torch.float32)[:, None]
            aux = t.repeat(1, H * len(self.aux_layers)) / 7
            final = t.repeat(1, H) / 5 if self.teacher.final_hidden else None
            outs.append(CaptureOutput(aux, final, None, None))
        return outs

    def shutdown(self):
        self.shut = True


def prepared(d: Path, samples: list[list[int]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    d.mkdir(parents=True)
    table = pa.table(
        {
            "input_ids": pa.array(samples, pa.list_(pa.int32())),
            "loss_mask": pa.array([[0] + [1] * (len(s) - 1) for s in samples], pa.list_(pa.uint8())),
            "source_id": [f"s{i}" for i in range(len(samples))],
            "sample_id": pa.array(range(len(samples)), pa.int64()),
        }
    )
    pq.write_table(table, d / "train.parquet")
    # What the worker reads of report.json; the vocabulary and tokenizer digest it records are
    # deliberately unlike the metadata's: aerie checked those, the worker must not.
    report = {"format": "aerie-prepared/1", "vocab_size": 1, "tokenizer_digest": "0" * 64, "template": "other",
              "max_length": 40, "splits": {"train": {"file": "train.parquet", "samples": len(samples)}}}
    (d / "report.json").write_text(json.dumps(report))
    return d


def metadata(**over) -> Metadata:
    md = Metadata(target="org/target-name", target_num_layers=LAYERS, target_vocab_size=VOCAB, aux_layer_ids=[0, 2, 4],
                  aux_convention="output-of-layer", hidden_size=H, dtype="f32", tokenizer_digest="ab" * 32,
                  chat_template="chatml", teacher=Teacher(True, None), created_by="aerie-capture 9.9.9")
    for k, v in over.items():
        setattr(md, k, v)
    return md


class UsesWhatAeriePasses(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        # A target with no tokenizer.json (as Kimi's): the worker once fell back to the prepared
        # data's digest here; now it has no rule of its own to fall back from.
        (self.root / "target").mkdir()
        self.data = prepared(self.root / "data", [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]])

    def tearDown(self):
        self.tmp.cleanup()

    def args(self, md: Metadata, *extra: str):
        return worker.parse_args(["--target", str(self.root / "target"), "--data", str(self.data), "--out", str(self.root / "out"),
                                  "--metadata", json.dumps(md.to_map()), *extra])

    def test_the_shards_carry_the_metadata_aerie_passed(self):
        md = metadata()
        made = []

        def build(a, aux, teacher):
            made.append(FakeEngine(aux, teacher))
            return made[-1]

        with mock.patch.object(worker, "build_engine", build):
            report = worker.run(self.args(md))
        self.assertEqual(made[0].aux_layers, [0, 2, 4])
        self.assertTrue(made[0].shut)
        self.assertEqual(report["captured_samples"], 3)
        got = ShardDataset(self.root / "out").metadata
        want = md.to_map()
        want["created_by"] = "aerie-capture 9.9.9 (fake engine)"
        self.assertEqual(got.to_map(), want)

    def test_an_engine_that_loaded_another_shape_is_refused(self):
        for info, key in ((TargetInfo(LAYERS + 1, H, VOCAB, "x"), "target_num_layers"), (TargetInfo(LAYERS, H, VOCAB + 2, "x"), "target_vocab_size")):
            with mock.patch.object(worker, "build_engine", lambda a, aux, t, info=info: FakeEngine(aux, t, info)):
                with self.assertRaises(SystemExit) as e:
                    worker.run(self.args(metadata()))
            self.assertIn(key, str(e.exception))
            self.assertFalse((self.root / "out" / "manifest.json").exists())

    def test_the_vllm_prompt_length_follows_the_prepared_data(self):
        a = self.args(metadata())
        with mock.patch.object(worker, "build_engine", lambda a, aux, t: FakeEngine(aux, t)):
            worker.run(a)
        self.assertEqual(a.max_model_len, 41)

    def test_a_missing_pyarrow_stops_the_worker_before_any_engine(self):
        built = []
        with mock.patch.dict(sys.modules, {"pyarrow": None}), mock.patch("importlib.util.find_spec", lambda m, *r: None if m == "pyarrow" else object()), \
                mock.patch.object(worker, "build_engine", lambda *x: built.append(x)):
            with self.assertRaises(SystemExit) as e:
                worker.main(["--target", "t", "--data", "d", "--out", "o", "--metadata", "{}"])
        self.assertIn("pyarrow", str(e.exception))
        self.assertEqual(built, [])

    def test_engine_defaults(self):
        e = FakeEngine([1], Teacher(True, None))
        self.assertTrue(e.is_writer)
        self.assertEqual(e.broadcast(7), 7)
        Engine.shutdown(e)


if __name__ == "__main__":
    unittest.main()
