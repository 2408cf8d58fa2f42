#!/usr/bin/env bash
# Headless MuJoCo rendering needs libEGL or libOSMesa. Installs libosmesa6 + libegl1 with apt when neither
# is present (idempotent); without root or apt, says in one line what to install instead.
set -u
have() { ldconfig -p 2>/dev/null | grep -q "$1"; }
if have 'libEGL.so.1' || have 'libOSMesa.so'; then
  exit 0
fi
pkgs="libosmesa6 libegl1 libgl1"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing $pkgs for headless MuJoCo rendering"
  (apt-get install -y -qq $pkgs >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq $pkgs >/dev/null; }) \
    || { echo "system_deps: apt-get could not install $pkgs; install them by hand (headless MuJoCo rendering)" >&2; exit 1; }
else
  echo "system_deps: headless MuJoCo rendering needs libEGL or libOSMesa; run: sudo apt-get install -y $pkgs" >&2
  exit 1
fi
