package wire

import "unicode/utf8"

// Wire limits shared by rdzvctl, the controller and the agent, so that what
// one side may send the other accepts. README.md lists them.
const (
	// MaxNodes bounds a job's nodes.max; a round of this many fits in
	// MaxMessageBytes.
	MaxNodes = 10000
	// MaxGPUsPerNode and MaxProcsPerNode bound what a node reports and a
	// job asks for.
	MaxGPUsPerNode  = 64
	MaxProcsPerNode = 256
	// MaxMessageBytes bounds every gRPC message in both directions; a round
	// of 10,000 nodes fits.
	MaxMessageBytes = 16 << 20
	// MaxSpecBytes bounds a job spec's encoded size. The job record is
	// written to etcd with an event in one request, and etcd refuses
	// requests over 1.5 MiB by default.
	MaxSpecBytes = 512 << 10
	// MaxLogChunkBytes bounds one log chunk an agent sends.
	MaxLogChunkBytes = 64 << 10
	// MaxLogTailBytes bounds how far back `rdzvctl logs --tail` may start.
	MaxLogTailBytes = 256 << 20
	// MaxTextBytes bounds free text an agent reports (worker messages,
	// errors, GPU fault descriptions, interface reasons).
	MaxTextBytes = 4096
	// MaxEnvValueBytes bounds one environment variable's value, whether
	// given in the job or read from an env_files file on the node.
	MaxEnvValueBytes = 32 << 10
	// MaxRequestIDBytes bounds the ids that pair agent replies with
	// controller requests (the controller makes 16 hex digits).
	MaxRequestIDBytes = 64
)

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
