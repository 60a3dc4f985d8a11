"""The environment a job's processes get. Pure (stdlib only).

Two layers:

* `scrub(environ, secrets=...)`: what the control plane hands to the Ray processes it starts
  (the embedded `ray.init`, `ray start` in deploy/): its own environment without anything
  meshyard-private — every `MESHYARD_*` variable (the admin token, the database URL and every
  other setting), and any variable whose value contains one of the secrets (an operator who
  also exported the database URL as `DATABASE_URL`).
* `allowlisted(environ)`: what a worker actor keeps before it runs a job — only the names and
  prefixes below; everything else a node's environment happens to hold is dropped. The rank's
  own variables (RANK, MASTER_ADDR, MESHYARD_RUN_DIR, NCCL_DEBUG, ...) are set after this.

>>> scrub({"PATH": "/bin", "MESHYARD_ADMIN_TOKEN": "t", "DB": "postgresql://u:pw@h/db"},
...       secrets=["postgresql://u:pw@h/db"])
{'PATH': '/bin'}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

PRIVATE_PREFIX = "MESHYARD_"
MIN_SECRET_CHARS = 8  # shorter "secrets" would match innocent values

ALLOWED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    "PWD", "HOSTNAME", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "VIRTUAL_ENV",
    "LD_LIBRARY_PATH", "LD_PRELOAD", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
})
ALLOWED_PREFIXES = (
    "LC_", "CUDA_", "NVIDIA_", "NCCL_", "TORCH_", "PYTORCH_", "OMP_", "MKL_", "GLOO_", "UCX_",
    "FI_", "TP_", "KMP_", "TRITON_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "RAY_",
)


def scrub(environ: Mapping[str, str], *, secrets: Iterable[str | None] = ()) -> dict[str, str]:
    keep = [s for s in secrets if s and len(s) >= MIN_SECRET_CHARS]
    return {k: v for k, v in environ.items()
            if not k.startswith(PRIVATE_PREFIX) and not any(s in v for s in keep)}


def is_allowed(name: str) -> bool:
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def allowlisted(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if is_allowed(k)}
