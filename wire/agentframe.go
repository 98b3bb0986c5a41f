package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// An agent's stream through a relay travels as length-prefixed frames over
// the TLS connection, not as a gRPC call: TLS's ALPN names AgentProtocol,
// and a relay admits no other. The stream is the same as a direct one:
// ConnectRequest messages up, ConnectResponse messages down, and a status
// to end it. Frames keep what a relay holds per agent small: the TLS
// connection, one goroutine reading it, and a writer only while messages
// wait, where gRPC's server transport holds several goroutines and tens of
// KiB of heap per connection, all of it scanned by every collection of a
// relay that carries thousands of agents.
//
// A frame is a 4-byte big-endian length, then that many bytes: a kind, then
// its payload.
const AgentProtocol = "rdzv-agent/1"

// Frame kinds.
const (
	// FrameMessage is a ConnectRequest from the agent, a ConnectResponse
	// from the relay, as encoded by protobuf.
	FrameMessage byte = 1
	// FramePing asks for a FramePong; either carries no payload. The agent
	// pings a connection it heard nothing on for AgentKeepaliveTime.
	FramePing byte = 2
	FramePong byte = 3
	// FrameEnd ends the stream, from the relay: a google.rpc.Status, as
	// gRPC's trailers would carry it. The relay closes the connection after.
	FrameEnd byte = 4
)

// The agent's keepalive, as for its gRPC connections (agent.Keepalive): a
// connection it heard nothing on for AgentKeepaliveTime is pinged, and given
// up AgentKeepaliveTimeout later unless something arrives. A relay gives up
// on a connection it heard nothing on for AgentIdleTimeout: the agent's
// heartbeats, or its pings, come far more often.
const (
	AgentKeepaliveTime    = 10 * time.Second
	AgentKeepaliveTimeout = 5 * time.Second
	AgentIdleTimeout      = 2 * (AgentKeepaliveTime + AgentKeepaliveTimeout)
)

// MaxFrameBytes bounds a frame: a kind and one message.
const MaxFrameBytes = 1 + MaxMessageBytes

// MaxRegisterFrameBytes bounds a frame that a relay reads from an agent it
// has not admitted yet: one that has opened no stream on its connection,
// or is between two. What it sends then is a register, which validates
// (controller: validateRegister) only with its lists and texts bounded
// (64 workers, 64 GPUs, texts of MaxTextBytes at most): far below this. An
// admitted agent's frames may be MaxFrameBytes.
const MaxRegisterFrameBytes = 1 << 20

// frameChunk is what a frame's buffer starts at: it grows, doubling, as
// the frame's bytes arrive, so a length announced but not sent costs the
// reader no more than this.
const frameChunk = 64 << 10

// ErrFrameTooLarge is why a frame is refused: its length is over the
// reader's limit.
var ErrFrameTooLarge = errors.New("a frame over the limit")

// AppendFrame appends a frame of kind with payload to b.
func AppendFrame(b []byte, kind byte, payload []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(1+len(payload)))
	b = append(b, kind)
	return append(b, payload...)
}

// AppendMessage appends a FrameMessage of m to b.
func AppendMessage(b []byte, m proto.Message) ([]byte, error) {
	size := proto.Size(m)
	if size > MaxMessageBytes {
		return b, status.Errorf(codes.ResourceExhausted, "a message of %d bytes, over the limit of %d", size, MaxMessageBytes)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(1+size))
	b = append(b, FrameMessage)
	return proto.MarshalOptions{}.MarshalAppend(b, m)
}

// AppendEnd appends the FrameEnd of err (a gRPC status; nil is OK) to b.
func AppendEnd(b []byte, err error) []byte {
	// A status proto of a code and a message cannot fail to encode.
	p, _ := proto.Marshal(status.Convert(err).Proto())
	return AppendFrame(b, FrameEnd, p)
}

// ReadFrame reads one frame of at most MaxFrameBytes from r (ReadFrameUpTo).
func ReadFrame(r io.Reader) (byte, []byte, error) { return ReadFrameUpTo(r, MaxFrameBytes) }

// ReadFrameUpTo reads one frame from r: its kind and payload, in a new
// slice. A frame longer than limit is refused (ErrFrameTooLarge) before
// any of it is read. The length is the peer's word, not trusted for an
// allocation: the buffer grows as the bytes arrive, so it stays within
// twice what the peer sent, and frameChunk.
func ReadFrameUpTo(r io.Reader, limit int) (byte, []byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return 0, nil, err
	}
	n := int64(binary.BigEndian.Uint32(head[:]))
	switch {
	case n == 0:
		return 0, nil, io.ErrUnexpectedEOF
	case n > int64(limit):
		return 0, nil, fmt.Errorf("%w: %d bytes, over the limit of %d", ErrFrameTooLarge, n, limit)
	}
	size := int(n)
	b := make([]byte, min(size, frameChunk))
	for got := 0; ; {
		k, err := io.ReadFull(r, b[got:])
		got += k
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, nil, err
		}
		if got == size {
			return b[0], b[1:], nil
		}
		b = append(b, make([]byte, min(len(b), size-len(b)))...)
	}
}

// EndStatus is the status a FrameEnd's payload carries.
func EndStatus(payload []byte) (*status.Status, error) {
	var p spb.Status
	if err := proto.Unmarshal(payload, &p); err != nil {
		return nil, fmt.Errorf("decoding the end of a stream: %w", err)
	}
	return status.FromProto(&p), nil
}
