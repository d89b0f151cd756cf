"""The scaled encodings of docs/shard-format.md §3.1 in the Python writer: fp8-e4m3 codes are the
nearest E4M3FN values (ties to the even code, saturating at ±448), int4 rounds half to even and
packs value 2j in the low nibble, both stay within the documented error bounds, and the format-2
rules (scales present, positive and finite; a scaled dtype never under format 1) are enforced.
The byte-for-byte agreement with the Rust writer is checked from Rust
(`crates/aerie-cli/tests/python_capture.rs`), against `aerie shards convert`."""

import json
import sys
import unittest
from pathlib import Path

import torch
from safetensors import safe_open

from aerie_capture.encodings import ENCODINGS, FP8_E4M3_MAX, encode_finite, encoding
from aerie_capture.shards import Metadata, ShardDataset, ShardError, ShardWriter, Teacher, write_safetensors

sys.path.insert(0, str(Path(__file__).parent))
from tmp_dataset import TempDatasetDir  # noqa: E402

# The 254 finite E4M3FN values, by code (0x7f and 0xff are NaN).
CODES = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


def nearest_code(v: float) -> int:
    """Brute force: the finite code nearest to v, ties to the even code, of v's sign."""
    best = None
    for c in range(256):
        x = float(CODES[c])
        if x != x or (c & 0x80) != (0x80 if v < 0 or (v == 0 and str(v).startswith("-")) else 0):
            continue
        key = (abs(x - v), c & 1)
        if best is None or key < best[0]:
            best = (key, c)
    return best[1]


class Fp8(unittest.TestCase):
    def test_codes_are_the_nearest_e4m3_values(self):
        enc = encoding("fp8-e4m3")
        g = torch.Generator().manual_seed(0)
        finite = CODES[torch.isfinite(CODES)]
        mids = ((finite[:-1] + finite[1:]) / 2)[finite[:-1] * finite[1:] >= 0]  # exact ties
        vals = torch.cat([
            finite, mids, torch.randn(2000, generator=g) * 30, torch.rand(500, generator=g) * 2**-6,
            torch.tensor([447.9, -447.99, 0.0, -0.0, 2**-10, -(2**-10), 3 * 2**-11]),
        ])
        # One group whose amax is 448, so the scale is exactly 1 and the codes are the values'.
        row = torch.cat([vals, torch.tensor([FP8_E4M3_MAX])]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).reshape(1, -1)
        codes, scales = enc.encode(row, row.shape[1])
        self.assertEqual(float(scales[0, 0]), 1.0)
        got = codes.view(torch.uint8).reshape(-1).tolist()
        for v, c in zip(row.reshape(-1).tolist(), got):
            self.assertEqual(c, nearest_code(v), f"{v}")

    def test_saturates_and_stays_within_the_bound(self):
        enc = encoding("fp8-e4m3")
        g = torch.Generator().manual_seed(1)
        x = torch.randn(16, 3 * 64, generator=g) * torch.logspace(-8, 3, 16).unsqueeze(1)
        x[3, 5] = 0.0
        x[4, :64] = 0.0  # an all-zero group
        codes, scales = enc.encode(x, 64)
        self.assertEqual(list(scales.shape), [16, 3])
        self.assertTrue(bool((scales > 0).all()))
        y = enc.decode(codes, scales, 64)
        self.assertTrue(bool((y[4, :64] == 0).all()))
        amax = x.abs().reshape(16, 3, 64).amax(2, keepdim=True).expand(16, 3, 64).reshape(16, -1)
        s = amax / FP8_E4M3_MAX
        bound = torch.maximum(x.abs() / 16, s / 1024) + amax * 2**-20
        self.assertTrue(bool(((y - x).abs() <= bound).all()), float(((y - x).abs() - bound).max()))
        self.assertTrue(bool(torch.isfinite(y).all()))


class Int4(unittest.TestCase):
    def test_rounds_half_to_even_and_packs_low_nibble_first(self):
        enc = encoding("int4")
        # amax 7: scale 1, codes are the rounded values.
        row = torch.tensor([[0.5, 1.5, 2.5, -0.5, -2.5, 7.0, -7.0, 3.49] + [0.0] * 24])
        codes, scales = enc.encode(row, 32)
        self.assertEqual(float(scales[0, 0]), 1.0)
        want = [0, 2, 2, 0, -2, 7, -7, 3] + [0] * 24
        nibbles = [n + 8 for n in want]
        self.assertEqual(codes[0].tolist(), [nibbles[2 * j] | nibbles[2 * j + 1] << 4 for j in range(16)])
        self.assertEqual(enc.decode(codes, scales, 32)[0].tolist(), [float(v) for v in want])

    def test_stays_within_the_bound(self):
        enc = encoding("int4")
        g = torch.Generator().manual_seed(2)
        x = torch.randn(8, 128, generator=g) * 5
        codes, scales = enc.encode(x, 32)
        self.assertEqual((list(codes.shape), list(scales.shape)), ([8, 64], [8, 4]))
        y = enc.decode(codes, scales, 32)
        s = scales.repeat_interleave(32, dim=1)
        self.assertTrue(bool(((y - x).abs() <= s / 2 + 7 * s * 2**-20).all()))


def metadata(dtype, hidden=32):
    return Metadata(
        target="tiny", target_num_layers=4, target_vocab_size=50, aux_layer_ids=[0, 2], aux_convention="output-of-layer",
        hidden_size=hidden, dtype=dtype, tokenizer_digest="ab" * 32, chat_template="chatml",
        teacher=Teacher.parse("final-hidden"), created_by="aerie-capture test",
    )


class Format2(TempDatasetDir, unittest.TestCase):
    def write(self, dtype):
        # No checksums: the tests rewrite shard files to damage them.
        w = ShardWriter.create(self.dir, metadata(dtype), checksums=False)
        g = torch.Generator().manual_seed(3)
        for i in range(3):
            w.push([1, 2, 3], [0, 1, 1], torch.randn(3, 64, generator=g), torch.randn(3, 32, generator=g), sample_id=i)
        w.finish()
        return self.dir / "shard-00000.safetensors"

    def test_scaled_shards_declare_format_2_and_carry_their_scales(self):
        for dtype, stored, width in (("fp8-e4m3", "F8_E4M3", 64), ("int4", "U8", 32)):
            path = self.write(dtype)
            with safe_open(path, framework="pt") as f:
                self.assertEqual(f.metadata()["format"], "aerie-shard/2")
                self.assertEqual(f.get_slice("aux_hidden").get_dtype(), stored)
                self.assertEqual(list(f.get_slice("aux_hidden").get_shape()), [9, width])
                # fp8: a scale per token and layer (2 layers; 1 for final_hidden); int4: per 32 values.
                self.assertEqual(list(f.get_slice("aux_hidden_scales").get_shape()), [9, 2])
                self.assertEqual(list(f.get_slice("final_hidden_scales").get_shape()), [9, 1])
            ShardDataset(self.dir).verify()
            self.tearDown()
            self.setUp()

    def test_int4_needs_a_hidden_size_that_is_a_multiple_of_32(self):
        with self.assertRaises(ShardError) as e:
            ShardWriter.create(self.dir, metadata("int4", hidden=48))
        self.assertIn("multiple of 32", str(e.exception))

    def test_bad_scales_and_a_scaled_dtype_under_format_1_are_refused(self):
        path = self.write("fp8-e4m3")
        with safe_open(path, framework="pt") as f:
            md = f.metadata()
            # Copies: safetensors may map the file, which is rewritten below.
            ts = {k: f.get_tensor(k).clone() for k in f.keys()}
        for bad in (0.0, -1.0, float("nan"), float("inf")):
            t = dict(ts)
            t["aux_hidden_scales"] = ts["aux_hidden_scales"].clone()
            t["aux_hidden_scales"][1, 1] = bad
            write_safetensors(path, t, md)
            with self.assertRaises(ShardError) as e:
                ShardDataset(self.dir).verify()
            self.assertIn("aux_hidden_scales[1, 1]", str(e.exception))
            self.assertIn(str(path), str(e.exception))
        t = dict(ts)
        del t["final_hidden_scales"]
        write_safetensors(path, t, md)
        with self.assertRaises(ShardError) as e:
            ShardDataset(self.dir)
        self.assertIn("final_hidden_scales: missing", str(e.exception))
        write_safetensors(path, ts, md)
        m = json.loads((self.dir / "manifest.json").read_text())
        m["format"] = "aerie-shard/1"
        (self.dir / "manifest.json").write_text(json.dumps(m))
        with self.assertRaises(ShardError) as e:
            ShardDataset(self.dir)
        self.assertIn("needs aerie-shard/2", str(e.exception))

    def test_non_finite_input_is_refused_naming_the_position(self):
        x = torch.zeros(2, 32)
        x[1, 7] = float("nan")
        for dtype in ("fp8-e4m3", "int4"):
            with self.assertRaises(ValueError) as e:
                encode_finite(ENCODINGS[dtype], x, "aux_hidden", 32)
            self.assertIn("aux_hidden[1, 7]", str(e.exception))


if __name__ == "__main__":
    unittest.main()
