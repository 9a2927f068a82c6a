"""The study: settings, samplers, storage, the set-up of reference and baseline, the ask/tell loop, and how workers
share one study through its storage."""
