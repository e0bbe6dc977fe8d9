#!/usr/bin/env bash
# Installs the system packages backends needs on a fresh Debian/Ubuntu machine:
# Mesa's lavapipe Vulkan driver and the Vulkan loader, so that wgpu finds an adapter
# even without a GPU. Safe to run again: it installs only what is missing.
set -euo pipefail

packages=(mesa-vulkan-drivers libvulkan1)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null; then
  echo "setup: install a Vulkan driver and loader (${missing[*]} on Debian) with your package manager" >&2
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "setup: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
