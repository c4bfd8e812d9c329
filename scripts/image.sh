#!/usr/bin/env bash
# The ichor-rules container image, built without a container daemon or registry:
#
#   bash scripts/image.sh build [OUT]   # OCI image layout at OUT (default target/image)
#   bash scripts/image.sh smoke [OUT]   # unpack it and run its entrypoint from the rootfs
#
# The image holds one file that runs: a statically linked, stripped release binary
# (`-C target-feature=+crt-static`, glibc linked in), so it needs no libc, no shell and no
# base image. Its layout:
#
#   /usr/local/bin/ichor-rules         ENTRYPOINT ["/usr/local/bin/ichor-rules"]
#   /usr/share/ichor-rules/rules/      the shipped rules (rules/*.rules, not rules/tests/)
#   /etc/passwd, /etc/group            user and group 65532 "nonroot" (the image's USER)
#   /tmp                               mode 1777
#
# The tag is Cargo.toml's version (the chart's appVersion). Pushing it needs no daemon
# either (docs/operators.md, "The image"):
#
#   skopeo copy oci:target/image:0.1.0 docker://ghcr.io/maesh/ichor-rules:0.1.0
#
# Needs umoci (Debian's `umoci`, installed here when missing) and a Rust toolchain.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode="${1:-build}"
out="${2:-target/image}"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
triple="$(rustc -vV | sed -n 's/^host: //p')"
tag="$version"

# shellcheck source=scripts/apt.sh
source scripts/apt.sh
ensure_apt_packages "umoci:umoci"

# umoci maps file owners to the caller when not run as root.
rootless=()
[[ "$(id -u)" -ne 0 ]] && rootless=(--rootless)

build() {
  echo "==> cargo build --release --target $triple (static)"
  # A target given explicitly keeps the static flags away from build scripts and proc
  # macros, which must stay dynamic.
  RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
    cargo build --release --locked --target "$triple" --bin ichor-rules
  local bin="${CARGO_TARGET_DIR:-target}/$triple/release/ichor-rules"
  local work
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  cp "$bin" "$work/ichor-rules"
  strip "$work/ichor-rules"
  # Static (static-pie): no shared library needed (readelf, from binutils like strip).
  if readelf -d "$work/ichor-rules" | grep -q '(NEEDED)'; then
    echo "error: $bin needs shared libraries; the image has no libc" >&2
    return 1
  fi

  rm -rf "$out"
  mkdir -p "$(dirname "$out")"
  umoci init --layout "$out"
  umoci new --image "$out:$tag"
  umoci unpack "${rootless[@]}" --image "$out:$tag" "$work/bundle"
  local root="$work/bundle/rootfs"
  install -d -m 0755 "$root/usr/local/bin" "$root/usr/share/ichor-rules/rules" "$root/etc"
  install -d -m 1777 "$root/tmp"
  install -m 0755 "$work/ichor-rules" "$root/usr/local/bin/ichor-rules"
  install -m 0644 rules/*.rules "$root/usr/share/ichor-rules/rules/"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
  umoci repack --image "$out:$tag" "$work/bundle"
  umoci config --image "$out:$tag" \
    --config.user 65532:65532 \
    --config.entrypoint /usr/local/bin/ichor-rules \
    --config.cmd check --config.cmd /usr/share/ichor-rules/rules \
    --config.workingdir / \
    --config.label "org.opencontainers.image.title=ichor-rules" \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label "org.opencontainers.image.licenses=Apache-2.0"
  umoci gc --layout "$out"
  local size
  size="$(du -sb "$out/blobs" | cut -f1)"
  echo "built $out:$tag ($size bytes of blobs; binary $(stat -c %s "$work/ichor-rules") bytes)"
}

smoke() {
  local work
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  umoci unpack "${rootless[@]}" --image "$out:$tag" "$work/bundle"
  local root="$work/bundle/rootfs" config="$work/bundle/config.json"
  # The entrypoint and user as the runtime would run them (config.json's process).
  local entry
  entry="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["process"]["args"][0])' "$config")"
  local uid
  uid="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["process"]["user"]["uid"])' "$config")"
  [[ "$entry" == /usr/local/bin/ichor-rules ]] || { echo "error: entrypoint is $entry" >&2; return 1; }
  [[ "$uid" == 65532 ]] || { echo "error: the image runs as uid $uid, not 65532" >&2; return 1; }
  run() {
    if [[ "$(id -u)" -eq 0 ]] && command -v chroot >/dev/null 2>&1; then
      chroot --userspec=65532:65532 "$root" "$entry" "$@"
    else
      # Not root: no chroot; the binary is static, so it runs the same from the rootfs.
      "$root$entry" "${@//\/usr\/share/$root/usr/share}"
    fi
  }
  echo "==> image: ichor-rules --version"
  run --version | tee "$work/version"
  grep -q "$version" "$work/version" || { echo "error: version is not $version" >&2; return 1; }
  echo "==> image: ichor-rules check /usr/share/ichor-rules/rules"
  run check /usr/share/ichor-rules/rules | tee "$work/check"
  grep -q "0 errors" "$work/check" || { echo "error: the embedded rules do not check" >&2; return 1; }
  echo "image smoke test passed: $out:$tag"
}

case "$mode" in
build) build ;;
smoke) smoke ;;
*)
  echo "usage: bash scripts/image.sh build|smoke [OUT]" >&2
  exit 2
  ;;
esac
