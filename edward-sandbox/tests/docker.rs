//! `DockerSandboxProvider` against a real Docker daemon: the shared
//! conformance suite. Needs a daemon and the test image: `scripts/test.sh`
//! starts both (or `scripts/dockerd.sh start && scripts/docker-image.sh`).

mod docker_common;

use docker_common::provider;
use edward_core::testkit::sandbox as suite;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_run_all() {
    suite::run_all(&provider().await).await;
}

/// One test per check as well, so a failure names the check.
macro_rules! conformance {
    ($($check:ident),* $(,)?) => {
        mod conformance {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    suite::$check(&provider().await).await;
                }
            )*
        }
    };
}

conformance!(
    provision_is_idempotent,
    write_read_round_trip,
    rewrite_replaces_whole_content,
    read_missing_is_not_found,
    list_sorted_with_sizes,
    invalid_paths_refused,
    exec_echo_and_ls,
    exec_nonzero_exit_code,
    exec_request_env,
    exec_cwd_honoured,
    exec_missing_program,
    exec_output_cap,
    exec_timeout_kills,
    exec_cancel_kills,
    destroy_removes_files,
);
