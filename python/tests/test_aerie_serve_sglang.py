"""`python -m aerie_serve sglang`: its argument reading, and the one seam it changes in SGLang (the
intel_amx → torch_native fallback on the CPU), checked against the installed SGLang 0.5.23 when
there is one (skipped otherwise: the test venv has no SGLang; serve_sglang.rs runs this file in
SGLang's venv and fails on any skip)."""

import importlib.util
import os
import tempfile
import types
import unittest

from aerie_serve import sglang as launcher

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None


class Arguments(unittest.TestCase):
    def test_device_in_both_spellings(self):
        self.assertEqual(launcher.device_of(["--model-path", "m", "--device", "cpu"]), "cpu")
        self.assertEqual(launcher.device_of(["--device=cuda", "--port", "1"]), "cuda")
        self.assertIsNone(launcher.device_of(["--model-path", "m"]))
        self.assertIsNone(launcher.device_of(["--device"]))

    def test_test_kernels_must_hold_sgl_kernel(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(SystemExit) as e:
                launcher.use_test_kernels(d)
            self.assertIn("sgl_kernel", str(e.exception))


@unittest.skipUnless(HAVE_SGLANG, "SGLang is not installed in this Python")
class KeepIntelAmx(unittest.TestCase):
    def test_intel_amx_stays_on_the_cpu_and_everything_else_is_sglangs(self):
        from sglang.srt.arg_groups import attention_hook, overrides

        name = "_attention_backend_platform_fallbacks"
        original = getattr(overrides, name)
        view = lambda backend, device: types.SimpleNamespace(attention_backend=backend, device=device)  # noqa: E731
        xpu = original(view("intel_xpu", "xpu"))
        launcher.keep_intel_amx_on_cpu()
        try:
            kept = getattr(overrides, name)
            self.assertIsNot(kept, original)
            self.assertIs(getattr(attention_hook, name), kept)
            self.assertIn(kept, overrides.POST_PROCESS_PASSES)
            self.assertNotIn(original, overrides.POST_PROCESS_PASSES)
            self.assertEqual(kept(view("intel_amx", "cpu")), {})
            # Every other platform and backend: SGLang's own decision.
            self.assertEqual(kept(view("intel_xpu", "xpu")), xpu)
            self.assertEqual(kept(view("torch_native", "cpu")), original(view("torch_native", "cpu")))
        finally:
            passes = overrides.POST_PROCESS_PASSES
            passes[:] = [original if p is getattr(overrides, name) else p for p in passes]
            setattr(overrides, name, original)
            setattr(attention_hook, name, original)

    def test_without_amx_kernels_sglang_would_fall_back(self):
        # Why the launcher exists: with no compiled CPU kernels SGLang reports no AMX and rewrites
        # intel_amx to torch_native, on which EAGLE refuses to run.
        from sglang.srt.arg_groups import overrides

        view = types.SimpleNamespace(attention_backend="intel_amx", device="cpu")
        self.assertEqual(overrides._attention_backend_platform_fallbacks(view), {"attention_backend": "torch_native"})

    def test_version_json(self):
        self.assertEqual(launcher.version_json(), '{"engine": "sglang", "distribution": "sglang", "version": "0.5.23"}')


if __name__ == "__main__":
    unittest.main()
