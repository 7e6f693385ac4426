//! The header a tool prints before its first measurement (what runs where: device, link,
//! trigger, memory, ranks, cores), from the same fields its `--json` rows carry.

use super::json::{Object, Value};

/// The fields of a run, in order.
#[derive(Clone, Debug, Default)]
pub struct Header {
    tool: &'static str,
    fields: Object,
    /// Lines after the first (`# ...`), such as units.
    notes: Vec<String>,
}

impl Header {
    pub fn new(tool: &'static str) -> Header {
        Header {
            tool,
            ..Header::default()
        }
    }
    /// Adds a field to both the header line and the JSON rows.
    pub fn field(mut self, key: &str, v: impl Into<Value>) -> Header {
        self.fields = self.fields.set(key, v);
        self
    }
    /// Adds a line of explanation under the header (text only).
    pub fn note(mut self, line: impl Into<String>) -> Header {
        self.notes.push(line.into());
        self
    }
    /// The fields, for the JSON rows.
    pub fn json(&self) -> &Object {
        &self.fields
    }
    /// `# tool: key value, key value, ...` and the notes, each line starting with `#`.
    pub fn text(&self) -> String {
        let parts: Vec<String> = self
            .fields
            .fields()
            .iter()
            .map(|(k, v)| match v {
                Value::Str(s) => format!("{k} {s}"),
                Value::Null => format!("{k} -"),
                v => format!("{k} {}", v.to_json()),
            })
            .collect();
        let mut t = format!("# {}: {}", self.tool, parts.join(", "));
        for n in &self.notes {
            t.push_str("\n# ");
            t.push_str(n);
        }
        t
    }
}

/// The cores this process may run on (`available_parallelism`: affinity and cgroup quotas
/// included).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
