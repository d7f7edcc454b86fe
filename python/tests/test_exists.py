"""batch_exists and batch_status on a local directory."""

from __future__ import annotations

import os
import pathlib
import unittest

import uringtier
from uringtier import Status

from .support import TempDirTest


class BatchExists(TempDirTest):
    def test_answers_like_os_path_exists(self) -> None:
        present = os.path.join(self.dir, "present")
        with open(present, "w"):
            pass
        os.mkdir(os.path.join(self.dir, "sub"))
        paths = [
            present,
            os.path.join(self.dir, "absent"),
            os.path.join(self.dir, "sub"),
            os.path.join(present, "below"),  # ENOTDIR
            pathlib.Path(present),
            os.fsencode(present),
        ] * 300
        self.assertEqual(uringtier.batch_exists(paths), [os.path.exists(p) for p in paths])
        self.assertEqual(uringtier.batch_status(paths[:4]),
                         [Status.FOUND, Status.MISSING, Status.FOUND, Status.MISSING])
        self.assertEqual(uringtier.batch_exists([]), [])
        self.assertEqual(uringtier.batch_exists(iter([present])), [True])

    def test_bad_paths(self) -> None:
        with self.assertRaisesRegex(uringtier.InvalidRequestError, "NUL"):
            uringtier.batch_exists(["a\0b"])
        with self.assertRaises(TypeError):
            uringtier.batch_exists([42])

    def test_other_errors_are_failed_and_false(self) -> None:
        # A loop of access() calls takes any failure for "absent"; batch_exists does too, and
        # batch_status tells it apart. A name over NAME_MAX fails with ENAMETOOLONG, even for root.
        long_name = os.path.join(self.dir, "x" * 300)
        self.assertEqual(uringtier.batch_status([long_name]), [Status.FAILED])
        self.assertEqual(uringtier.batch_exists([long_name]), [os.path.exists(long_name)])


if __name__ == "__main__":
    unittest.main()
