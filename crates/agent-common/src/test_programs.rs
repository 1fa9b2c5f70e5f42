//! Programs for the test suite and the benchmark only, compiled into the
//! object with `agent-ebpf`'s `test-programs` feature (never shipped).

use crate::program::Program;

/// Dereferences a raw tracepoint argument directly: the verifier refuses it.
pub const VERIFIER_REJECTS: Program = Program::raw("verifier_rejects", "sys_exit");
/// Does nothing: the floor of a probe's cost on a hook.
pub const EMPTY: Program = Program::raw("empty", "sys_exit");
