"""The Python aerie-shard/1 and /2 writer and reader on synthetic data: round trips in every dtype,
shard cutting, refusals, the crash points of docs/shard-format.md §7 and resume, the lock."""

import json
import sys
import unittest
from pathlib import Path

import torch

from aerie_capture.encodings import ENCODINGS
from aerie_capture.shards import (
    KEYS, LOCK_FILE, LockedError, Metadata, ShardDataset, ShardError, ShardWriter, Teacher, shard_file_name,
)

sys.path.insert(0, str(Path(__file__).parent))
from tmp_dataset import TempDatasetDir  # noqa: E402


def metadata(dtype="f32", teacher="final-hidden+topk:4", **kw):
    m = Metadata(
        target="tiny", target_num_layers=4, target_vocab_size=50, aux_layer_ids=[0, 2], aux_convention="output-of-layer",
        hidden_size=8, dtype=dtype, tokenizer_digest="ab" * 32, chat_template="chatml", teacher=Teacher.parse(teacher),
        created_by="aerie-capture test",
    )
    for k, v in kw.items():
        setattr(m, k, v)
    return m


def sample(t, seed, k=4, vocab=50, hidden=8, layers=2):
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(t, vocab, generator=g), -1)
    v, i = lp.topk(k, -1)
    return dict(
        input_ids=torch.randint(0, vocab, (t,), generator=g),
        loss_mask=torch.randint(0, 2, (t,), generator=g),
        aux_hidden=torch.randn(t, hidden * layers, generator=g),
        final_hidden=torch.randn(t, hidden, generator=g),
        topk_ids=i, topk_logprobs=v, sample_id=1000 + seed,
    )


class Shards(TempDatasetDir, unittest.TestCase):
    def test_round_trip_in_every_dtype(self):
        for dtype, enc in ENCODINGS.items():
            d = self.dir / dtype
            w = ShardWriter.create(d, metadata(dtype, hidden_size=32), shard_tokens=20)
            samples = [sample(3 + i, i, hidden=32) for i in range(9)]
            group = enc.group(32)

            def stored(x):
                return enc.decode(*enc.encode(x, group), group)

            for s in samples:
                w.push(**s)
            w.finish()
            ds = ShardDataset(d)
            rep = ds.verify()
            self.assertEqual(rep["samples"], 9)
            self.assertEqual(ds.metadata.to_map(), metadata(dtype, hidden_size=32).to_map())
            self.assertEqual(json.loads((d / "manifest.json").read_text())["format"], enc.format)
            for s, r in zip(samples, ds.samples()):
                self.assertTrue(torch.equal(r.input_ids, s["input_ids"].to(torch.int32)))
                self.assertTrue(torch.equal(r.loss_mask, s["loss_mask"].to(torch.uint8)))
                self.assertTrue(torch.equal(r.aux_hidden, stored(s["aux_hidden"])), dtype)
                self.assertTrue(torch.equal(r.final_hidden, stored(s["final_hidden"])), dtype)
                self.assertTrue(torch.equal(r.topk_ids, s["topk_ids"].to(torch.int32)))
                self.assertTrue(torch.equal(r.topk_logprobs, s["topk_logprobs"]))
                self.assertEqual(r.sample_id, s["sample_id"])

    def test_the_file_layout_is_the_safetensors_librarys(self):
        from safetensors.torch import save
        from aerie_capture.shards import write_safetensors

        g = torch.Generator().manual_seed(0)
        tensors = {
            "aux_hidden": torch.randn(5, 6, generator=g).to(torch.bfloat16), "input_ids": torch.arange(5, dtype=torch.int32),
            "loss_mask": torch.tensor([0, 1, 1, 0, 1], dtype=torch.uint8), "sample_offsets": torch.tensor([0, 2, 5]),
            "teacher_topk_logprobs": -torch.rand(5, 3, generator=g), "b_first": torch.zeros(3, dtype=torch.float16), "a_ids": torch.arange(4, dtype=torch.int32),
            "final_hidden": torch.ones(5, 2, dtype=torch.bfloat16), "sample_ids": torch.arange(2),
        }
        path = Path(self.tmp.name) / "x.safetensors"
        # One metadata key: the library's hash-map order cannot differ from the sorted one.
        write_safetensors(path, tensors, {"format": "aerie-shard/1"})
        self.assertEqual(path.read_bytes(), save(tensors, metadata={"format": "aerie-shard/1"}))

    def test_every_metadata_key_is_written_in_shards_and_manifest(self):
        w = ShardWriter.create(self.dir, metadata(extra={"capture_max_len": "4096"}))
        w.push(**sample(5, 0))
        w.finish()
        manifest = json.loads((self.dir / "manifest.json").read_text())
        from safetensors import safe_open

        with safe_open(self.dir / shard_file_name(0), framework="pt") as f:
            shard_md = f.metadata()
        for key in KEYS:
            self.assertIn(key, manifest["metadata"])
            self.assertEqual(shard_md[key], manifest["metadata"][key], key)
        self.assertEqual(manifest["metadata"]["aux_layer_ids"], "[0,2]")
        self.assertEqual(manifest["metadata"]["format"], "aerie-shard/1")
        self.assertEqual(shard_md["capture_max_len"], "4096")
        self.assertEqual(manifest["shards"][0]["sha256"], __import__("aerie_capture.shards").shards.sha256_file(self.dir / shard_file_name(0)))

    def test_shards_are_cut_as_the_rust_writer_cuts_them(self):
        w = ShardWriter.create(self.dir, metadata(), shard_tokens=10)
        for t in (4, 4, 4, 12, 3, 7):
            w.push(**sample(t, t * 7 + w.samples_written))
        w.finish()
        tokens = [e.tokens for e in ShardDataset(self.dir).manifest.shards]
        # 4+4 (a third 4 would pass 10), 4 (12 alone), 12, 3+7 (reaches 10, closes).
        self.assertEqual(tokens, [8, 4, 12, 10])

    def test_refusals_leave_no_trace(self):
        w = ShardWriter.create(self.dir, metadata("f16"), shard_tokens=100)
        good = sample(4, 1)
        w.push(**good)
        cases = {
            "not finite as f16": dict(aux_hidden=torch.full((4, 16), 1e6)),
            "aux_hidden[2, 5] is not finite": dict(aux_hidden=torch.zeros(4, 16).index_put_((torch.tensor(2), torch.tensor(5)), torch.tensor(float("nan")))),
            "final_hidden[3, 0] is not finite": dict(final_hidden=torch.zeros(4, 8).index_put_((torch.tensor(3), torch.tensor(0)), torch.tensor(float("-inf")))),
            "neither 0 nor 1": dict(loss_mask=torch.tensor([0, 1, 2, 0])),
            "outside the target vocabulary": dict(input_ids=torch.tensor([0, 1, 50, 2])),
            "expected [4, 16]": dict(aux_hidden=torch.zeros(4, 8)),
            "not descending": dict(topk_logprobs=torch.tensor([[-3.0, -2.0, -4.0, -5.0]] * 4)),
            "already written": dict(sample_id=good["sample_id"]),
            "final_hidden missing": dict(final_hidden=None),
        }
        for needle, change in cases.items():
            bad = {**sample(4, 2), **change}
            with self.assertRaises(ShardError) as e:
                w.push(**bad)
            self.assertIn(needle, str(e.exception))
            self.assertIn("sample #1", str(e.exception))
        self.assertEqual(w.samples_written, 1)
        w.finish()
        self.assertEqual(len(ShardDataset(self.dir)), 1)

    def test_metadata_is_validated(self):
        for change, key in [
            (dict(aux_layer_ids=[2, 1]), "aux_layer_ids"), (dict(aux_layer_ids=[4]), "aux_layer_ids"),
            (dict(tokenizer_digest="AB" * 32), "tokenizer_digest"), (dict(dtype="fp8"), "dtype"),
            (dict(chat_template=""), "chat_template"), (dict(target=""), "target"),
            (dict(aux_convention="output"), "aux_convention"), (dict(extra={"target": "x"}), "target"),
        ]:
            with self.assertRaises(ShardError) as e:
                ShardWriter.create(self.dir, metadata(**change))
            self.assertIn(f"`{key}`", str(e.exception))
        with self.assertRaises(ValueError):
            Teacher.parse("topk:04")

    def test_crash_leftovers_are_removed_on_resume(self):
        w = ShardWriter.create(self.dir, metadata(), shard_tokens=8)
        for i in range(4):
            w.push(**sample(4, i))  # two shards committed
        w.close()  # dies: nothing pending was lost here, but simulate the two crash points
        (self.dir / ".tmp-shard-00002.safetensors").write_bytes(b"half a shard")
        (self.dir / shard_file_name(2)).write_bytes(b"complete but unlisted")
        w, info = ShardWriter.resume(self.dir, shard_tokens=8)
        self.assertEqual((info.shards, info.samples, info.tokens), (2, 4, 16))
        self.assertEqual(sorted(p.name for p in info.removed), [".tmp-shard-00002.safetensors", shard_file_name(2)])
        self.assertEqual(info.sample_ids, {1000, 1001, 1002, 1003})
        with self.assertRaises(ShardError):
            w.push(**sample(4, 0))  # id 1000 again
        w.push(**sample(4, 4))
        w.finish()
        ds = ShardDataset(self.dir)
        self.assertEqual([s.sample_id for s in ds.samples()], [1000, 1001, 1002, 1003, 1004])
        ds.verify()

    def test_resume_refuses_other_metadata_but_allows_another_created_by(self):
        w = ShardWriter.create(self.dir, metadata())
        w.push(**sample(3, 0))
        w.finish()
        with self.assertRaises(ShardError) as e:
            ShardWriter.open_or_create(self.dir, metadata(hidden_size=16, aux_layer_ids=[0, 2]))
        self.assertIn("hidden_size", str(e.exception))
        w, info = ShardWriter.open_or_create(self.dir, metadata(created_by="a newer build"))
        self.assertEqual(info.samples, 1)
        w.close()

    def test_one_writer_at_a_time(self):
        w = ShardWriter.create(self.dir, metadata())
        with self.assertRaises(LockedError) as e:
            ShardWriter.resume(self.dir)
        self.assertIn(LOCK_FILE, str(e.exception))
        w.finish()
        w2, _ = ShardWriter.resume(self.dir)  # released by finish
        w2.close()

    def test_reader_refuses_a_shard_that_disagrees_with_the_manifest(self):
        w = ShardWriter.create(self.dir, metadata())
        w.push(**sample(3, 0))
        w.finish()
        m = json.loads((self.dir / "manifest.json").read_text())
        m["metadata"]["hidden_size"] = "16"
        m["metadata"]["aux_layer_ids"] = "[0, 2]"
        (self.dir / "manifest.json").write_text(json.dumps(m))
        with self.assertRaises(ShardError) as e:
            ShardDataset(self.dir)
        self.assertIn("hidden_size", str(e.exception))
        self.assertNotIn("aux_layer_ids", str(e.exception))  # `[0, 2]` equals `[0,2]`
        m["format"] = "aerie-shard/3"
        (self.dir / "manifest.json").write_text(json.dumps(m))
        with self.assertRaises(ShardError) as e:
            ShardDataset(self.dir)
        self.assertIn("aerie-shard/3", str(e.exception))


if __name__ == "__main__":
    unittest.main()
