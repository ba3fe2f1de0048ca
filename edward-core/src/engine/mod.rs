//! The run engine: admission, worker, agent loop, budgets, event pipeline, flush scheduler, install queue.
