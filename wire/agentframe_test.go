package wire_test

import (
	"bytes"
	"encoding/binary"
	"io"
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
