import lzma
import shutil
from pathlib import Path

import pytest



def pytest_collection_modifyitems(config, items):
    """GPU tests run only where CUDA is available (the lent GPU machine)."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def runs_with_exports(tmp_path_factory):
    """A function (data folder, run names) -> a temporary copy of those run directories with
    their nsys exports, stored as report.sqlite.xz to keep the repository small, decompressed
    (the analysis reads plain SQLite; memory snapshots stay compressed, as it reads those)."""
    def copy(data: Path, names: tuple[str, ...]) -> Path:
        root = tmp_path_factory.mktemp(data.name)
        for name in names:
            shutil.copytree(data / name, root / name,
                            ignore=shutil.ignore_patterns("*.sqlite.xz"))
            (root / name / "report.sqlite").write_bytes(
                lzma.decompress((data / name / "report.sqlite.xz").read_bytes()))
        return root

    return copy
