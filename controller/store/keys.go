// Package store is the controller's durable state in etcd.
//
// # Key schema
//
// Every key lives under Prefix ("/rdzv/v1/"); values are binary protobuf
// messages from proto/rdzv/v1. This file is the only place keys are built.
//
//	/rdzv/v1/nodes/<node>                      Node: registration and durable state (READY or LOST).
//	                                           Written on registration, state transitions, cordons and
//	                                           agent restart announcements only, never per heartbeat
//	                                           (liveness is tracked in memory). Deleted by the leader's
//	                                           retention once LOST for retention.lost_node_max_age and
//	                                           not cordoned (DeleteNode); the agent registering again
//	                                           writes it anew.
//	/rdzv/v1/jobs/<job>                        Job: spec, state, reason, current generation, master.
//	/rdzv/v1/generation-floor                  UInt64Value: the highest generation of every job deleted
//	                                           so far (DeleteJob writes it with the job's keys' removal).
//	                                           A job created under a name without a record counts its
//	                                           generations from here: agents refuse assignments whose
//	                                           generation is not above the last they ran of that name.
//	/rdzv/v1/rounds/<job>/<generation>         Round: the nodes and ranks of one committed rendezvous,
//	                                           one key per generation (generation zero-padded to 20
//	                                           digits so keys sort numerically).
//	/rdzv/v1/workers/<job>/<node>              WorkerStatus: one node's worker state in the current
//	                                           generation. Per node so a report rewrites one small key.
//	                                           One of an older generation is superseded (CommitRound).
//	/rdzv/v1/checkpoints/<job>/<step>          Checkpoint: the job's catalog of complete checkpoints
//	                                           (step zero-padded to 20 digits), newest kept, bounded.
//	/rdzv/v1/events/<scope>/<time>-<seq>       Event; scope is a job name or "_cluster". time is
//	                                           UnixNano zero-padded to 20 digits, seq a per-process
//	                                           counter, so keys sort by time.
//	/rdzv/v1/revoked/serial/<serial>           Revocation: one client certificate on the deny-list, by
//	                                           serial number (lowercase hex, pki.Serial).
//	/rdzv/v1/revoked/identity/<role>/<name>    Revocation: every certificate of an identity issued before
//	                                           a time; revoking it again replaces the entry. Entries of
//	                                           both kinds are deleted once their not_after has passed
//	                                           (every certificate they revoke has expired by then).
//	/rdzv/v1/leader/<lease id>                 Controller election (etcd concurrency.Election): one
//	                                           key per campaigning controller, value its advertised
//	                                           gRPC address, attached to its session lease. The key
//	                                           created first leads; every state write is guarded on
//	                                           the leader's key still having its create revision.
//
// Job and node names are DNS-1123 labels (validated before any key is
// built), so they never contain '/' and "_cluster" cannot collide with a job.
// So are identities' names, and roles are a fixed set; serials are hex.
package store

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Prefix is the root of every rdzv key.
const Prefix = "/rdzv/v1/"

// ClusterScope is the event scope for events that belong to no job.
const ClusterScope = "_cluster"

const (
	nodesPrefix   = Prefix + "nodes/"
	jobsPrefix    = Prefix + "jobs/"
	roundsPrefix  = Prefix + "rounds/"
	workersPrefix = Prefix + "workers/"
	eventsPrefix  = Prefix + "events/"
	ckptPrefix    = Prefix + "checkpoints/"
	floorKey      = Prefix + "generation-floor"
	revokedPrefix = Prefix + "revoked/"
	// electionName has no trailing slash: concurrency.NewElection adds it.
	electionName = Prefix + "leader"
)

// ElectionName is the election controllers campaign in, in the form
// concurrency.NewElection takes; candidates' keys are under
// CandidatesPrefix.
func ElectionName() string { return electionName }

// CandidatesPrefix covers every campaigning controller's key.
func CandidatesPrefix() string { return electionName + "/" }

// CheckpointKey is the key of one checkpoint in a job's catalog.
func CheckpointKey(job string, step uint64) string {
	return fmt.Sprintf("%s%s/%020d", ckptPrefix, job, step)
}

// CheckpointsPrefix covers a job's checkpoint catalog.
func CheckpointsPrefix(job string) string { return ckptPrefix + job + "/" }

// NodeKey is the key of one node's record.
func NodeKey(node string) string { return nodesPrefix + node }

// NodesPrefix covers every node record.
func NodesPrefix() string { return nodesPrefix }

// JobKey is the key of one job's record.
func JobKey(job string) string { return jobsPrefix + job }

// JobsPrefix covers every job record.
func JobsPrefix() string { return jobsPrefix }

// RoundKey is the key of one generation's round.
func RoundKey(job string, generation uint64) string {
	return fmt.Sprintf("%s%s/%020d", roundsPrefix, job, generation)
}

// RoundsPrefix covers every round of one job.
func RoundsPrefix(job string) string { return roundsPrefix + job + "/" }

// WorkerKey is the key of one node's worker status within a job.
func WorkerKey(job, node string) string { return workersPrefix + job + "/" + node }

// WorkersPrefix covers every worker status of one job.
func WorkersPrefix(job string) string { return workersPrefix + job + "/" }

// EventKey is the key of one event.
func EventKey(scope string, at time.Time, seq uint64) string {
	return fmt.Sprintf("%s%s/%020d-%012d", eventsPrefix, scope, at.UnixNano(), seq)
}

// EventsPrefix covers every event of one scope.
func EventsPrefix(scope string) string { return eventsPrefix + scope + "/" }

// GenerationFloorKey is the key of the deleted jobs' highest generation.
func GenerationFloorKey() string { return floorKey }

// eventCursorLen is the length of an event key after its scope's prefix.
const eventCursorLen = 20 + 1 + 12

// eventKeyAt is the key of a scope's event at cursor (an event key without
// its scope's prefix, as ListEvents returns it), or an error if cursor is
// not one: a cursor from a client never reaches outside the scope.
func eventKeyAt(scope, cursor string) (string, error) {
	ok := len(cursor) == eventCursorLen && cursor[20] == '-'
	for i := 0; ok && i < len(cursor); i++ {
		ok = i == 20 || cursor[i] >= '0' && cursor[i] <= '9'
	}
	if !ok {
		return "", fmt.Errorf("%q is not an event cursor: %w", cursor, ErrBadCursor)
	}
	return EventsPrefix(scope) + cursor, nil
}

// RevokedSerialKey is the deny-list entry of one certificate; serial is
// in pki.Serial's form.
func RevokedSerialKey(serial string) string { return revokedPrefix + "serial/" + serial }

// RevokedIdentityKey is the deny-list entry of one identity, written
// ROLE/NAME.
func RevokedIdentityKey(identity string) string { return revokedPrefix + "identity/" + identity }

// RevokedPrefix covers the deny-list.
func RevokedPrefix() string { return revokedPrefix }

// nameFromKey returns the last path element of key under prefix.
func nameFromKey(prefix, key string) (string, error) {
	name, ok := strings.CutPrefix(key, prefix)
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", fmt.Errorf("unexpected key %q under %q", key, prefix)
	}
	return name, nil
}

// generationFromRoundKey parses the generation out of a RoundKey.
func generationFromRoundKey(key string) (uint64, error) {
	i := strings.LastIndexByte(key, '/')
	g, err := strconv.ParseUint(key[i+1:], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing generation of round key %q: %w", key, err)
	}
	return g, nil
}
