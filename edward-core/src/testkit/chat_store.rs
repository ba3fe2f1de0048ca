//! Conformance suite for the chat part of [`RunStore`]: messages
//! (`put_messages`, `chat_messages`), build jobs (`create_build`,
//! `claim_build`, `finish_build`, `builds`) and per-chat admission scoped by
//! user. Every adapter runs [`run_all`].

use std::sync::Arc;

use super::run_store::{NO_LIMITS, cleanup, new_run};
use super::{unique, within};
use crate::{
    AdmissionError, AdmissionLimits, AdmitError, BuildResult, BuildStatus, CommandNote, Fence,
    FileNote, MessageRole, NewMessage, RunStore, StoreError, TurnEffects,
};

/// Run every check.
pub async fn run_all(store: Arc<dyn RunStore>) {
    check_messages_round_trip(&*store).await;
    check_replayed_turn_replaces(&*store).await;
    check_history_before_run_and_limit(&*store).await;
    check_messages_scoped_by_user_and_chat(&*store).await;
    check_messages_fenced(&*store).await;
    check_per_chat_limit_scoped_by_user(&*store).await;
    check_build_lifecycle(&*store).await;
    check_build_claimed_once(Arc::clone(&store)).await;
    check_build_take_over_by_newer_fence(&*store).await;
}

fn effects() -> TurnEffects {
    TurnEffects {
        files: vec![FileNote {
            path: "src/app.ts".into(),
            bytes: 120,
        }],
        installs: vec![],
        commands: vec![CommandNote {
            command: "npm run build".into(),
            exit_code: Some(1),
            output: "error TS2304: Cannot find name 'x'. ünïcode".into(),
        }],
    }
}

/// Messages come back in `(run, turn, index)` order with every field.
pub async fn check_messages_round_trip(store: &dyn RunStore) {
    let (user, chat) = (unique("user"), unique("chat"));
    let run = store.admit(new_run(&user, &chat), NO_LIMITS).await.unwrap();
    let started = store.start_run(run.id, Fence(1)).await.unwrap();
    assert_eq!(started.fence, Fence(1));
    store
        .put_messages(
            run.id,
            Fence(1),
            0,
            vec![NewMessage::user("build a todo app")],
        )
        .await
        .unwrap();
    store
        .put_messages(
            run.id,
            Fence(1),
            1,
            vec![NewMessage::assistant("Here it is.", effects())],
        )
        .await
        .unwrap();
    let got = store.chat_messages(&user, &chat, None, 100).await.unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].role, MessageRole::User);
    assert_eq!(got[0].text, "build a todo app");
    assert_eq!((got[0].turn, got[0].index), (0, 0));
    assert_eq!(got[0].effects, None);
    assert_eq!(got[1].role, MessageRole::Assistant);
    assert_eq!(got[1].text, "Here it is.");
    assert_eq!((got[1].turn, got[1].index), (1, 0));
    assert_eq!(got[1].effects.as_ref(), Some(&effects()));
    assert!(got.iter().all(|m| m.run_id == run.id));
    cleanup(store, &[run.id]).await;
}

/// Writing turn n again replaces turn n and drops later turns: a replayed
/// or superseded turn never leaves a duplicate or orphan message.
pub async fn check_replayed_turn_replaces(store: &dyn RunStore) {
    let (user, chat) = (unique("user"), unique("chat"));
    let run = store.admit(new_run(&user, &chat), NO_LIMITS).await.unwrap();
    store.start_run(run.id, Fence(1)).await.unwrap();
    for turn in 0..3 {
        store
            .put_messages(
                run.id,
                Fence(1),
                turn,
                vec![NewMessage::assistant(
                    format!("turn {turn}"),
                    TurnEffects::default(),
                )],
            )
            .await
            .unwrap();
    }
    // A resumed attempt supersedes turns ≥ 1, then redoes turn 1.
    store.start_run(run.id, Fence(2)).await.unwrap();
    store
        .put_messages(run.id, Fence(2), 1, vec![])
        .await
        .unwrap();
    let got = store.chat_messages(&user, &chat, None, 100).await.unwrap();
    assert_eq!(
        got.iter().map(|m| m.text.as_str()).collect::<Vec<_>>(),
        ["turn 0"]
    );
    store
        .put_messages(
            run.id,
            Fence(2),
            1,
            vec![
                NewMessage::assistant("redo a", TurnEffects::default()),
                NewMessage::assistant("redo b", TurnEffects::default()),
            ],
        )
        .await
        .unwrap();
    let got = store.chat_messages(&user, &chat, None, 100).await.unwrap();
    assert_eq!(
        got.iter()
            .map(|m| (m.turn, m.index, m.text.as_str()))
            .collect::<Vec<_>>(),
        [(0, 0, "turn 0"), (1, 0, "redo a"), (1, 1, "redo b")]
    );
    cleanup(store, &[run.id]).await;
}

/// `before_run` excludes that run and later ones; `limit` keeps the newest.
pub async fn check_history_before_run_and_limit(store: &dyn RunStore) {
    let (user, chat) = (unique("user"), unique("chat"));
    let mut ids = Vec::new();
    for i in 0..3 {
        let run = store.admit(new_run(&user, &chat), NO_LIMITS).await.unwrap();
        store.start_run(run.id, Fence(1)).await.unwrap();
        store
            .put_messages(run.id, Fence(1), 0, vec![NewMessage::user(format!("p{i}"))])
            .await
            .unwrap();
        store
            .put_messages(
                run.id,
                Fence(1),
                1,
                vec![NewMessage::assistant(
                    format!("r{i}"),
                    TurnEffects::default(),
                )],
            )
            .await
            .unwrap();
        ids.push(run.id);
    }
    let texts = |v: Vec<crate::ChatMessage>| v.into_iter().map(|m| m.text).collect::<Vec<_>>();
    let all = store.chat_messages(&user, &chat, None, 100).await.unwrap();
    assert_eq!(texts(all), ["p0", "r0", "p1", "r1", "p2", "r2"]);
    let before = store
        .chat_messages(&user, &chat, Some(ids[2]), 100)
        .await
        .unwrap();
    assert_eq!(texts(before), ["p0", "r0", "p1", "r1"]);
    let newest = store
        .chat_messages(&user, &chat, Some(ids[2]), 3)
        .await
        .unwrap();
    assert_eq!(
        texts(newest),
        ["r0", "p1", "r1"],
        "the newest 3, oldest first"
    );
    cleanup(store, &ids).await;
}

/// Another user's chat of the same id, and another chat, see nothing.
pub async fn check_messages_scoped_by_user_and_chat(store: &dyn RunStore) {
    let (alice, bob, chat) = (unique("alice"), unique("bob"), unique("chat"));
    let run = store
        .admit(new_run(&alice, &chat), NO_LIMITS)
        .await
        .unwrap();
    store.start_run(run.id, Fence(1)).await.unwrap();
    store
        .put_messages(run.id, Fence(1), 0, vec![NewMessage::user("secret plan")])
        .await
        .unwrap();
    assert!(
        store
            .chat_messages(&bob, &chat, None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .chat_messages(&alice, &unique("other"), None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .chat_messages(&alice, &chat, None, 100)
            .await
            .unwrap()
            .len(),
        1
    );
    cleanup(store, &[run.id]).await;
}

/// An old fence cannot write messages; an unknown run is `NotFound`.
pub async fn check_messages_fenced(store: &dyn RunStore) {
    let (user, chat) = (unique("user"), unique("chat"));
    let run = store.admit(new_run(&user, &chat), NO_LIMITS).await.unwrap();
    store.start_run(run.id, Fence(2)).await.unwrap();
    let err = store
        .put_messages(run.id, Fence(1), 0, vec![NewMessage::user("late")])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::StaleFence { .. }), "{err:?}");
    let err = store
        .put_messages(crate::RunId::new(), Fence(1), 0, vec![])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    assert!(
        store
            .chat_messages(&user, &chat, None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    cleanup(store, &[run.id]).await;
}

/// The per-chat admission limit counts the chat of one user: two users'
/// chats of the same id are separate chats.
pub async fn check_per_chat_limit_scoped_by_user(store: &dyn RunStore) {
    let chat = unique("chat");
    let limits = AdmissionLimits {
        global: u32::MAX,
        per_user: u32::MAX,
        per_chat: 1,
    };
    let a = store
        .admit(new_run(&unique("alice"), &chat), limits)
        .await
        .unwrap();
    let b = store
        .admit(new_run(&unique("bob"), &chat), limits)
        .await
        .expect("another user's chat of the same id is another chat");
    let again = store.admit(new_run(&a.user_id, &chat), limits).await;
    assert!(
        matches!(
            again,
            Err(AdmitError::Rejected(AdmissionError::ChatLimit { .. }))
        ),
        "{again:?}"
    );
    cleanup(store, &[a.id, b.id]).await;
}

fn result(status: BuildStatus, code: i32) -> BuildResult {
    BuildResult {
        status,
        exit_code: Some(code),
        output: "vite v5 building for production…".into(),
        duration_ms: 1234,
    }
}

/// `queued → building → failed`, create is idempotent, finishing twice or
/// without a claim is a `BuildConflict`, and `builds` lists by number.
pub async fn check_build_lifecycle(store: &dyn RunStore) {
    let run = store
        .admit(new_run(&unique("user"), &unique("chat")), NO_LIMITS)
        .await
        .unwrap();
    store.start_run(run.id, Fence(1)).await.unwrap();
    let cmd = vec!["npm".to_string(), "run".into(), "build".into()];
    let job = store
        .create_build(run.id, Fence(1), 1, cmd.clone())
        .await
        .unwrap();
    assert_eq!(job.status, BuildStatus::Queued);
    assert_eq!(job.command, cmd);
    assert_eq!(job.claim_fence, Fence(0));
    let err = store
        .finish_build(run.id, 1, Fence(1), result(BuildStatus::Failed, 1))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::BuildConflict { .. }), "{err:?}");
    let again = store
        .create_build(run.id, Fence(1), 1, vec!["other".into()])
        .await
        .unwrap();
    assert_eq!(again.command, cmd, "create is idempotent");
    let claimed = store
        .claim_build(run.id, 1, Fence(1), "w1")
        .await
        .unwrap()
        .expect("a queued build is claimable");
    assert_eq!(claimed.status, BuildStatus::Building);
    assert_eq!(claimed.claimed_by.as_deref(), Some("w1"));
    assert_eq!(claimed.claim_fence, Fence(1));
    let done = store
        .finish_build(run.id, 1, Fence(1), result(BuildStatus::Failed, 1))
        .await
        .unwrap();
    assert_eq!(done.status, BuildStatus::Failed);
    assert_eq!(done.exit_code, Some(1));
    assert_eq!(done.duration_ms, Some(1234));
    assert_eq!(
        done.output.as_deref(),
        Some("vite v5 building for production…")
    );
    assert!(
        store
            .claim_build(run.id, 1, Fence(1), "w2")
            .await
            .unwrap()
            .is_none(),
        "a finished build is not claimable"
    );
    let err = store
        .finish_build(run.id, 1, Fence(1), result(BuildStatus::Succeeded, 0))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::BuildConflict { .. }), "{err:?}");
    store.create_build(run.id, Fence(1), 2, cmd).await.unwrap();
    let all = store.builds(run.id).await.unwrap();
    assert_eq!(
        all.iter().map(|b| (b.number, b.status)).collect::<Vec<_>>(),
        [(1, BuildStatus::Failed), (2, BuildStatus::Queued)]
    );
    let err = store
        .claim_build(run.id, 3, Fence(1), "w1")
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::BuildConflict { .. }), "{err:?}");
    cleanup(store, &[run.id]).await;
}

/// Three concurrent claimers under one fence: exactly one wins.
pub async fn check_build_claimed_once(store: Arc<dyn RunStore>) {
    for _ in 0..5 {
        let run = store
            .admit(new_run(&unique("user"), &unique("chat")), NO_LIMITS)
            .await
            .unwrap();
        store.start_run(run.id, Fence(1)).await.unwrap();
        store
            .create_build(run.id, Fence(1), 1, vec!["npm".into()])
            .await
            .unwrap();
        let tasks: Vec<_> = (0..3)
            .map(|w| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    store
                        .claim_build(run.id, 1, Fence(1), &format!("w{w}"))
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            if let Some(job) = within("claim_build", t).await.unwrap() {
                winners.push(job.claimed_by.unwrap());
            }
        }
        assert_eq!(winners.len(), 1, "exactly one claim wins: {winners:?}");
        let stored = store.builds(run.id).await.unwrap();
        assert_eq!(stored[0].claimed_by.as_ref(), Some(&winners[0]));
        cleanup(&*store, &[run.id]).await;
    }
}

/// A build left `building` by a dead attempt is taken over by a newer
/// fence, never by an older one; the old claimer can no longer finish it.
pub async fn check_build_take_over_by_newer_fence(store: &dyn RunStore) {
    let run = store
        .admit(new_run(&unique("user"), &unique("chat")), NO_LIMITS)
        .await
        .unwrap();
    store.start_run(run.id, Fence(1)).await.unwrap();
    store
        .create_build(run.id, Fence(1), 1, vec!["npm".into()])
        .await
        .unwrap();
    assert!(
        store
            .claim_build(run.id, 1, Fence(1), "old")
            .await
            .unwrap()
            .is_some()
    );
    store.start_run(run.id, Fence(2)).await.unwrap();
    let err = store
        .claim_build(run.id, 1, Fence(1), "old")
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::StaleFence { .. }), "{err:?}");
    let job = store
        .claim_build(run.id, 1, Fence(2), "new")
        .await
        .unwrap()
        .expect("a newer fence takes over a building job");
    assert_eq!(job.claimed_by.as_deref(), Some("new"));
    let err = store
        .finish_build(run.id, 1, Fence(1), result(BuildStatus::Succeeded, 0))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::StaleFence { .. } | StoreError::BuildConflict { .. }
        ),
        "{err:?}"
    );
    let done = store
        .finish_build(run.id, 1, Fence(2), result(BuildStatus::Succeeded, 0))
        .await
        .unwrap();
    assert_eq!(done.status, BuildStatus::Succeeded);
    cleanup(store, &[run.id]).await;
}
