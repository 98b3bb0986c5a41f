package wire

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// Wire limits shared by rdzvctl, the controller and the agent, so that what
// one side may send the other accepts. docs/jobs.md#input-limits lists them.
const (
	// MaxNodes bounds a job's nodes.max; a round of this many fits in
	// MaxMessageBytes.
	MaxNodes = 10000
	// MaxGPUsPerNode and MaxProcsPerNode bound what a node reports and a
	// job asks for.
	MaxGPUsPerNode  = 64
	MaxProcsPerNode = 256
	// MaxMessageBytes bounds every gRPC message in both directions; a round
	// of MaxNodes nodes fits.
	MaxMessageBytes = 16 << 20
	// FlowWindow is every gRPC connection's and stream's HTTP/2 flow
	// control window, both ways. Set, it turns off gRPC's bandwidth
	// estimation, which otherwise answers nearly every message of a
	// stream as slow as a heartbeat with a window update and a PING that
	// the peer must answer: three writes and three reads on each side per
	// heartbeat instead of one, which would be most of the controller's
	// heartbeat CPU. 1 MiB moves a log chunk in one
	// round trip, and is less than the estimation may grow a window to.
	FlowWindow = 1 << 20
	// MaxSpecBytes bounds a job spec's encoded size. The job record is
	// written to etcd with an event in one request, and etcd refuses
	// requests over 1.5 MiB by default.
	MaxSpecBytes = 512 << 10
	// MaxLogChunkBytes bounds one log chunk an agent sends.
	MaxLogChunkBytes = 64 << 10
	// MaxLogTailBytes bounds how far back `rdzvctl logs --tail` may start.
	MaxLogTailBytes = 256 << 20
	// MaxLogTailLines bounds how many lines back `rdzvctl logs --tail` may
	// start.
	MaxLogTailLines = 1 << 20
	// MaxTextBytes bounds free text an agent reports (worker messages,
	// errors, GPU fault descriptions, interface reasons).
	MaxTextBytes = 4096
	// MaxEnvValueBytes bounds one environment variable's value, whether
	// given in the job or read from an env_files file on the node.
	MaxEnvValueBytes = 32 << 10
	// MaxRegisterMemoryJobs bounds the jobs whose in-memory checkpoint
	// holdings a registering agent reports (Register.memory); an agent
	// holding more reports the first, by name.
	MaxRegisterMemoryJobs = 64
	// MaxRequestIDBytes bounds the ids that pair agent replies with
	// controller requests (the controller makes 16 hex digits).
	MaxRequestIDBytes = 64
	// MaxPageBytes bounds a page of a list (jobs, nodes, events): a page
	// ends before its items would exceed it, and holds at least one item,
	// so it stays below this plus the largest single item, far under
	// MaxMessageBytes. It leaves room for the rest of the answer below
	// gRPC's default 4 MiB receive limit, so that a client with default
	// settings reads every page of items smaller than that.
	MaxPageBytes = 4<<20 - 64<<10
	// AgentBacklog bounds the messages waiting to be sent to one agent, at
	// the controller and at its relay alike: an agent that falls this far
	// behind is dropped, so it never holds up the others, and reconnects.
	// The same bound on both paths, so an agent is not dropped through its
	// relay where directly it would be kept.
	AgentBacklog = 256
)

// ItemBytes is what an item of n encoded bytes adds to a message's
// repeated field: its tag, its length and itself.
func ItemBytes(n int) int { return 1 + protowire.SizeVarint(uint64(n)) + n }

// ClipText cuts s to MaxTextBytes at a character boundary, for free text an
// agent sends: the controller refuses longer text, and protobuf refuses
// invalid UTF-8.
func ClipText(s string) string {
	if len(s) <= MaxTextBytes {
		return s
	}
	const marker = "..."
	cut := MaxTextBytes - len(marker)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + marker
}
