package relay

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// TestPassThrough: the relay's codec reads and writes an agent's message
// as it was encoded, bytes for bytes, and every other message as gRPC's
// proto codec does.
func TestPassThrough(t *testing.T) {
	c := newPassThrough()
	heartbeat := &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: 42}}}
	wire, err := proto.Marshal(heartbeat)
	require.NoError(t, err)
	garbage := []byte{0xff, 0x00, 0x01} // not a message: the relay does not look

	tests := []struct {
		name string
		in   []byte
	}{
		{"a message", wire},
		{"bytes that do not decode", garbage},
		{"empty", []byte{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			buf := append([]byte(nil), tt.in...)
			var got encoded
			require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(buf)}, &got))
			for i := range buf {
				buf[i] = 0 // gRPC reuses its buffers: what was read must be the relay's own
			}
			require.Equal(t, string(tt.in), string(got))
			out, err := c.Marshal(&got)
			require.NoError(t, err)
			require.Equal(t, string(tt.in), string(out.Materialize()))
		})
	}

	t.Run("other messages are proto's", func(t *testing.T) {
		out, err := c.Marshal(heartbeat)
		require.NoError(t, err)
		require.Equal(t, wire, out.Materialize())
		got := &rdzvv1.ConnectRequest{}
		require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, got))
		require.Equal(t, uint64(42), got.GetHeartbeat().GetSeq())
		require.Error(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(garbage)}, &rdzvv1.ConnectRequest{}))
	})
}
