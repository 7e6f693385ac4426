//! A `tracing` subscriber for tests that records every event (level, target, message and
//! fields), so a test can assert what the library logged. Install it on the threads that
//! emit the events with [`Capture::dispatch`] and `tracing::dispatcher::with_default`.

use std::fmt::Write;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// One recorded event.
#[derive(Clone, Debug)]
pub struct Logged {
    pub level: Level,
    pub target: String,
    /// The message, then ` name=value` for each other field.
    pub text: String,
}

/// The recording subscriber; clones share the record.
#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Vec<Logged>>>);

impl Capture {
    /// A dispatcher that records into this capture.
    pub fn dispatch(&self) -> tracing::Dispatch {
        tracing::Dispatch::new(self.clone())
    }

    /// Every event recorded so far.
    pub fn events(&self) -> Vec<Logged> {
        self.0.lock().unwrap().clone()
    }

    /// The events whose text contains every one of `words`.
    pub fn with(&self, words: &[&str]) -> Vec<Logged> {
        self.events()
            .into_iter()
            .filter(|e| words.iter().all(|w| e.text.contains(w)))
            .collect()
    }

    /// The one event whose text contains every one of `words` (panics listing all events
    /// if there is none, or more than one).
    pub fn one(&self, words: &[&str]) -> Logged {
        let found = self.with(words);
        assert!(
            found.len() == 1,
            "{} events contain {words:?}; all events:\n{}",
            found.len(),
            self.events()
                .iter()
                .map(|e| format!("{} {}: {}", e.level, e.target, e.text))
                .collect::<Vec<_>>()
                .join("\n")
        );
        found.into_iter().next().unwrap()
    }
}

/// Collects an event's fields into one line.
struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut text = Text(String::new());
        event.record(&mut text);
        self.0.lock().unwrap().push(Logged {
            level: *event.metadata().level(),
            target: event.metadata().target().to_string(),
            text: text.0,
        });
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}
