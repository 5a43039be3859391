//! Elected shards (issue 12; docs/sharding-design.md): one controller across
//! many replicas, each shard behind its own Lease. Work in progress on this
//! branch: only the assignment rules exist so far, not wired to electors.

// Not used yet: the sharded elector that will call it is the next step.
#![allow(dead_code)]

mod assign;
