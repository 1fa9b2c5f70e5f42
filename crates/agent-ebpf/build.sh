#!/usr/bin/env bash
# Builds the eBPF object with Debian's rustc-web toolchain (see
# docs/development.md). Used by `cargo xtask build-ebpf` and by
# the agent's build script, so there is one recipe.
# Usage: build.sh TARGET_DIR [FEATURES] [clippy]
# (FEATURES: e.g. test-programs, for the test object; `clippy`: lint with
# Debian's clippy of the same toolchain, warnings denied, instead of building).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
target_dir="${1:?usage: build.sh TARGET_DIR [FEATURES]}"
features="${2:-}"
mode="${3:-build}"
objcopy=/usr/lib/llvm-22/bin/llvm-objcopy
for tool in /usr/bin/cargo /usr/bin/rustc bpf-linker "$objcopy"; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run 'cargo xtask build-ebpf' (it installs the eBPF toolchain)" >&2; exit 1; }
done
[ -d /usr/lib/rustlib/bpfel-unknown-none ] || { echo "missing libstd-rust-web-dev-bpf: run 'cargo xtask build-ebpf'" >&2; exit 1; }
case "$(uname -m)" in
  x86_64) arch=x86_64 ;; aarch64) arch=aarch64 ;; *) arch="$(uname -m)" ;;
esac
cd "$here"
# rustup's variables would point cargo at another toolchain.
env -u RUSTUP_TOOLCHAIN -u RUSTC -u RUSTDOC -u CARGO -u RUSTC_WRAPPER -u RUSTC_WORKSPACE_WRAPPER \
    -u CARGO_ENCODED_RUSTFLAGS -u RUSTFLAGS -u CARGO_BUILD_RUSTFLAGS -u CARGO_MAKEFLAGS \
  RUSTC=/usr/bin/rustc \
  RUSTC_BOOTSTRAP=aya_ebpf,agent_ebpf \
  CARGO_TARGET_DIR="$target_dir" \
  CARGO_ENCODED_RUSTFLAGS="--cfg=bpf_target_arch=\"$arch\""$'\x1f'"-Cdebuginfo=2"$'\x1f'"-Clink-arg=--btf" \
  CARGO=/usr/bin/cargo \
  bash -c 'if [ "$0" = clippy ]; then
      exec /usr/bin/cargo-clippy clippy --release --target bpfel-unknown-none --bin agent-ebpf --all-features -- -D warnings
    else
      exec /usr/bin/cargo build --release --target bpfel-unknown-none --bin agent-ebpf ${1:+--features "$1"}
    fi' "$mode" "$features"
# The DWARF the linker turned into BTF is not needed at run time: without it
# the object is a sixth of the size, and the agent's loader reads (and keeps
# resident, as pages of the binary) only what it uses.
if [ "$mode" = build ]; then
  "$objcopy" --strip-debug "$target_dir/bpfel-unknown-none/release/agent-ebpf"
fi
