"""pip install for the Downpour Python SDK, from the source tree:

    /usr/bin/python3 -m pip install --no-build-isolation ./python

The extension module is built by Bazel (//python:downpour/_downpour.so, the
same build the tests use) and copied into the package. Where it is found:
  1. $DOWNPOUR_EXTENSION, a path to a built _downpour.so;
  2. downpour/_downpour.so beside this file (a copy of Bazel's runfiles);
  3. otherwise `bazel build` runs in the repository root (this file's
     parent folder) and bazel-bin's copy is taken.
Metadata lives in pyproject.toml.
"""

import os
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = "//python:downpour/_downpour.so"


def version() -> str:
    """The repository's VERSION file (one place for every version), or
    $DOWNPOUR_VERSION where the package is built outside the repository."""
    path = os.path.join(os.path.dirname(HERE), "VERSION")
    if os.path.isfile(path):
        with open(path) as f:
            return f.read().strip()
    if os.environ.get("DOWNPOUR_VERSION"):
        return os.environ["DOWNPOUR_VERSION"]
    raise RuntimeError(f"no {path} and no DOWNPOUR_VERSION")


def built_extension() -> str:
    path = os.environ.get("DOWNPOUR_EXTENSION")
    if path:
        if not os.path.isfile(path):
            raise RuntimeError(f"DOWNPOUR_EXTENSION={path} is not a file")
        return path
    beside = os.path.join(HERE, "downpour", "_downpour.so")
    if os.path.isfile(beside):
        return beside
    root = os.path.dirname(HERE)
    if not os.path.isfile(os.path.join(root, "WORKSPACE")):
        raise RuntimeError(
            f"{root} is not the Downpour repository and no built extension "
            "was given (set DOWNPOUR_EXTENSION)")
    bazel = shutil.which("bazel")
    if bazel is None:
        raise RuntimeError("bazel is not on PATH: run tools/setup.sh, or set "
                           "DOWNPOUR_EXTENSION to a built _downpour.so")
    subprocess.run([bazel, "build", TARGET], cwd=root, check=True)
    return os.path.join(root, "bazel-bin", "python", "downpour",
                        "_downpour.so")


class BazelExtension(Extension):
    def __init__(self):
        super().__init__("downpour._downpour", sources=[])


class build_with_bazel(build_ext):
    """Copies the Bazel-built module instead of compiling sources."""

    def build_extension(self, ext):
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built_extension(), target)
        os.chmod(target, 0o755)


setup(
    version=version(),
    ext_modules=[BazelExtension()],
    cmdclass={"build_ext": build_with_bazel},
)
