#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages kvlab builds with, if any is missing (with sudo when
# not root). Run by scripts/run.sh and scripts/test.sh; safe to run again.
set -euo pipefail
packages=(cmake g++ clang make ninja-build libeigen3-dev catch2 libbenchmark-dev libcli11-dev nlohmann-json3-dev unicode-data python3-pip doxygen graphviz doxygen-awesome-css libjs-mathjax chromium chromium-driver python3-selenium python3-matplotlib)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "kvlab: installing missing packages: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "kvlab: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
$sudo apt-get update -qq
# Debian packages Chromium (for the docs' browser check); Ubuntu ships it only as a snap, which
# the check does not use: there the check's browser pass reports itself skipped.
if [[ " ${missing[*]} " == *" chromium "* ]] && ! apt-cache show chromium >/dev/null 2>&1; then
  echo "kvlab: no 'chromium' package here (Ubuntu ships it as a snap): the docs' browser check will be skipped"
  kept=()
  for p in "${missing[@]}"; do [ "$p" = chromium ] || [ "$p" = chromium-driver ] || kept+=("$p"); done
  missing=("${kept[@]}")
  [ ${#missing[@]} -gt 0 ] || exit 0
fi
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "kvlab: packages installed"
