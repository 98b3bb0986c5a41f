package wire_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// Frames read back as written, several to a buffer, and a frame that is
// empty, cut short or over the limit is refused.
func TestAgentFrames(t *testing.T) {
	hb := &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: 7}}}
	b, err := wire.AppendMessage(nil, hb)
	require.NoError(t, err)
	b = wire.AppendFrame(b, wire.FramePing, nil)
	b = wire.AppendEnd(b, status.Error(codes.PermissionDenied, "not this node"))
	b = wire.AppendEnd(b, nil)
	r := bytes.NewReader(b)

	kind, p, err := wire.ReadFrame(r)
	require.NoError(t, err)
	require.Equal(t, wire.FrameMessage, kind)
	var m rdzvv1.ConnectRequest
	require.NoError(t, proto.Unmarshal(p, &m))
	require.Equal(t, uint64(7), m.GetHeartbeat().GetSeq())

	kind, p, err = wire.ReadFrame(r)
	require.NoError(t, err)
	require.Equal(t, wire.FramePing, kind)
	require.Empty(t, p)

	for _, want := range []struct {
		code codes.Code
		msg  string
	}{{codes.PermissionDenied, "not this node"}, {codes.OK, ""}} {
		kind, p, err = wire.ReadFrame(r)
		require.NoError(t, err)
		require.Equal(t, wire.FrameEnd, kind)
		st, err := wire.EndStatus(p)
		require.NoError(t, err)
		require.Equal(t, want.code, st.Code())
		require.Equal(t, want.msg, st.Message())
	}
	_, _, err = wire.ReadFrame(r)
	require.ErrorIs(t, err, io.EOF)

	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", binary.BigEndian.AppendUint32(nil, 0), io.ErrUnexpectedEOF},
		{"cut short", append(binary.BigEndian.AppendUint32(nil, 5), 1, 2), io.ErrUnexpectedEOF},
		{"over the limit", binary.BigEndian.AppendUint32(nil, wire.MaxMessageBytes+2), wire.ErrFrameTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := wire.ReadFrame(bytes.NewReader(tt.in))
			require.ErrorIs(t, err, tt.want)
		})
	}
	_, err = wire.AppendMessage(nil, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{Node: &rdzvv1.NodeInfo{Name: string(make([]byte, wire.MaxMessageBytes))}}}})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
}

// A frame over the reader's limit is refused from its length alone, and a
// length announced but not sent costs the reader no allocation of that
// size: the buffer grows as bytes arrive.
func TestReadFrameBounds(t *testing.T) {
	tests := []struct {
		name  string
		in    []byte
		limit int
		want  error
	}{
		{"within the limit", wire.AppendFrame(nil, wire.FrameMessage, make([]byte, 99)), 100, nil},
		{"one over the limit", wire.AppendFrame(nil, wire.FrameMessage, make([]byte, 100)), 100, wire.ErrFrameTooLarge},
		{"a register's limit", binary.BigEndian.AppendUint32(nil, wire.MaxRegisterFrameBytes+1), wire.MaxRegisterFrameBytes, wire.ErrFrameTooLarge},
		{"16 MB announced, 3 bytes sent", append(binary.BigEndian.AppendUint32(nil, 16_000_000), 1, 2, 3), wire.MaxFrameBytes, io.ErrUnexpectedEOF},
		{"a frame of several chunks", wire.AppendFrame(nil, wire.FrameMessage, bytes.Repeat([]byte{7}, 300<<10)), wire.MaxFrameBytes, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kind, p, err := wire.ReadFrameUpTo(bytes.NewReader(tt.in), tt.limit)
			if tt.want != nil {
				require.ErrorIs(t, err, tt.want)
				return
			}
			require.NoError(t, err)
			require.Equal(t, wire.FrameMessage, kind)
			require.Equal(t, tt.in[5:], p)
		})
	}

	// What reading a 16 MB header with nothing behind it allocates: a
	// chunk, not the 16 MB announced.
	head := binary.BigEndian.AppendUint32(nil, 16_000_000)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const reads = 20
	for range reads {
		_, _, err := wire.ReadFrame(bytes.NewReader(head))
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	}
	runtime.ReadMemStats(&after)
	perRead := (after.TotalAlloc - before.TotalAlloc) / reads
	require.Less(t, perRead, uint64(1<<20), "allocated %d bytes per read of a 16 MB header", perRead)
}

// FuzzReadFrame: any bytes read as frames either end in an error or give
// frames within the limit, whose re-encoding is the bytes read.
func FuzzReadFrame(f *testing.F) {
	hb, err := wire.AppendMessage(nil, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: 7}}})
	require.NoError(f, err)
	f.Add(hb, 64)
	f.Add(wire.AppendEnd(wire.AppendFrame(nil, wire.FramePing, nil), status.Error(codes.NotFound, "x")), 16)
	f.Add(binary.BigEndian.AppendUint32(nil, 16_000_000), wire.MaxFrameBytes)
	f.Add([]byte{0, 0, 0, 0}, 4)
	f.Fuzz(func(t *testing.T, in []byte, limit int) {
		limit = 1 + int(uint(limit)%uint(wire.MaxFrameBytes))
		r := bytes.NewReader(in)
		var again []byte
		for {
			kind, p, err := wire.ReadFrameUpTo(r, limit)
			if err != nil {
				break
			}
			require.LessOrEqual(t, 1+len(p), limit)
			again = wire.AppendFrame(again, kind, p)
		}
		require.True(t, bytes.Equal(in[:len(again)], again), "frames read re-encode as the bytes they came from")
	})
}
