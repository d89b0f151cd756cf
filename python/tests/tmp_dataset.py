"""A fresh temporary directory per test for the writer and reader suites (test_shards.py,
test_encodings.py): `self.tmp` is the directory, `self.dir` the dataset path inside it (not
created), and the directory is removed after each test."""

import tempfile
from pathlib import Path


class TempDatasetDir:
    """Mixin for a `unittest.TestCase`, listed before it: `class X(TempDatasetDir, unittest.TestCase)`."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name) / "ds"

    def tearDown(self):
        self.tmp.cleanup()
