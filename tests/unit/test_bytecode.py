"""Bytecode inside Spark's Python zips (rmq_spark._bytecode)."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from rmq_spark._bytecode import compile_zip, is_compiled, spark_python_zips

pytestmark = pytest.mark.unit
STAMP = (2024, 5, 6, 7, 8, 10)


def _zip(path, files: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, STAMP), data)
    return str(path)


def _run(zip_path: str, code: str) -> str:
    env = {**os.environ, "PYTHONPATH": zip_path}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True).stdout.strip()


def _replace(zip_path: str, name: str, data: bytes) -> None:
    """Rewrite the zip with ``name``'s content replaced, same entry time."""
    with zipfile.ZipFile(zip_path) as z:
        entries = [(i, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as z:
        for info, old in entries:
            z.writestr(info, data if info.filename == name else old)


@pytest.fixture
def pkg_zip(tmp_path) -> str:
    return _zip(tmp_path / "lib.zip", {
        "pkg/__init__.py": b"",
        "pkg/mod.py": b"X = 42\ndef f():\n    pass\n",
        "pkg/broken.py": b"def (:\n",
        "pkg/data.txt": b"not python",
    })


def test_adds_bytecode_next_to_each_compilable_source(pkg_zip):
    os.chmod(pkg_zip, 0o640)
    assert not is_compiled(pkg_zip)
    assert compile_zip(pkg_zip) == 2
    with zipfile.ZipFile(pkg_zip) as z:
        names = set(z.namelist())
        assert z.read("pkg/data.txt") == b"not python" and z.read("pkg/mod.py").startswith(b"X = 42")
    assert {"pkg/__init__.pyc", "pkg/mod.pyc"} <= names
    assert "pkg/broken.pyc" not in names          # left to fail from its source, as before
    assert os.stat(pkg_zip).st_mode & 0o777 == 0o640
    # code names its file as zipimport does (pyspark tells its own frames by that path)
    assert _run(pkg_zip, "import pkg.mod; print(pkg.mod.X, pkg.mod.f.__code__.co_filename)") \
        == f"42 {os.path.join(pkg_zip, 'pkg', 'mod.py')}"


def test_the_bytecode_is_what_zipimport_loads_while_it_matches_the_source(pkg_zip):
    compile_zip(pkg_zip)
    # same size and time: zipimport trusts the .pyc (proof that it is used at all)
    _replace(pkg_zip, "pkg/mod.py", b"X = 43\ndef f():\n    pass\n")
    assert _run(pkg_zip, "import pkg.mod; print(pkg.mod.X)") == "42"
    # another size: the .pyc is stale, zipimport compiles the source
    _replace(pkg_zip, "pkg/mod.py", b"X = 4300\n")
    assert _run(pkg_zip, "import pkg.mod; print(pkg.mod.X)") == "4300"


def test_a_compiled_zip_is_left_alone(pkg_zip):
    compile_zip(pkg_zip)
    before = os.stat(pkg_zip)
    assert is_compiled(pkg_zip) and compile_zip(pkg_zip) == 0
    after = os.stat(pkg_zip)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_zip_it_cannot_read_changes_nothing(tmp_path):
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"not a zip")
    with pytest.raises(zipfile.BadZipFile):
        compile_zip(str(bad))
    assert bad.read_bytes() == b"not a zip" and os.listdir(tmp_path) == ["bad.zip"]


def test_the_installed_spark_zips_are_compiled():
    """The Makefile's install step ran (``python -m rmq_spark._bytecode``)."""
    zips = spark_python_zips()
    assert any(os.path.basename(z) == "pyspark.zip" for z in zips), zips
    assert all(is_compiled(z) for z in zips), "run: .venv/bin/python -m rmq_spark._bytecode"
