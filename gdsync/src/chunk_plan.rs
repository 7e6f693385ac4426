//! How a large message is cut into bounce-sized chunks spread over a ring of bounce buffers,
//! for pipelined staging: while chunk k is on the wire from one bounce, chunk k+1 is copied
//! into the next. The plan only computes offsets, lengths and which bounce each chunk uses;
//! the caller copies, posts and waits for credits before reusing a bounce. Messages sent one
//! after another over the same ring continue its rotation ([`ChunkPlan::starting_at`]).

/// One chunk of a planned message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Index of the chunk within the message, from 0.
    pub index: usize,
    /// Byte offset of the chunk within the message.
    pub offset: usize,
    /// Length of the chunk in bytes (never 0; at most the plan's chunk size).
    pub len: usize,
    /// Which bounce buffer carries it: `seq % bounces`.
    pub bounce: usize,
    /// Position of the chunk in the stream of chunks over the ring (`first + index`, see
    /// [`ChunkPlan::starting_at`]): what a receiver expects next and what credits count.
    pub seq: usize,
}

/// A message of `len` bytes cut into chunks of at most `chunk` bytes over `bounces` bounces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkPlan {
    len: usize,
    chunk: usize,
    bounces: usize,
    /// Sequence number of the first chunk (chunks of earlier messages over the same ring).
    first: usize,
}

impl ChunkPlan {
    /// A plan; `None` when `chunk` or `bounces` is 0.
    pub fn new(len: usize, chunk: usize, bounces: usize) -> Option<ChunkPlan> {
        (chunk > 0 && bounces > 0).then_some(ChunkPlan {
            len,
            chunk,
            bounces,
            first: 0,
        })
    }

    /// The same plan for a message whose first chunk is chunk `first` of the stream over the
    /// ring (the earlier messages had `first` chunks): bounces rotate on from there, and
    /// credits name sequence numbers.
    pub fn starting_at(self, first: usize) -> ChunkPlan {
        ChunkPlan { first, ..self }
    }

    /// Number of chunks (0 for an empty message).
    pub fn count(&self) -> usize {
        self.len.div_ceil(self.chunk)
    }

    /// The chunk at `index`, or `None` past the last.
    pub fn get(&self, index: usize) -> Option<Chunk> {
        let offset = index.checked_mul(self.chunk)?;
        let seq = self.first.checked_add(index)?;
        (offset < self.len).then(|| Chunk {
            index,
            offset,
            len: self.chunk.min(self.len - offset),
            bounce: seq % self.bounces,
            seq,
        })
    }

    /// The chunks in order.
    pub fn chunks(&self) -> impl Iterator<Item = Chunk> + '_ {
        (0..self.count()).filter_map(move |i| self.get(i))
    }

    /// The sequence number of the chunk whose send must have been credited back before chunk
    /// `index` of this message may reuse its bounce (`first + index - bounces`), or `None`
    /// while the ring still has a fresh bounce.
    pub fn must_be_credited(&self, index: usize) -> Option<usize> {
        self.first.checked_add(index)?.checked_sub(self.bounces)
    }

    /// Bytes each bounce buffer needs (the chunk size, or less for a shorter message).
    pub fn bounce_len(&self) -> usize {
        self.chunk.min(self.len)
    }
}

#[cfg(test)]
#[path = "chunk_plan_tests.rs"]
mod tests;
