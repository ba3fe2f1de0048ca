//! The scripted model: replays transcripts (one per turn); the embedded default model.
