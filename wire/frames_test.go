package wire

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFrameQueueBatches: what queued before Run took it goes in one message,
// in order, split where CarryBatchBytes would be passed.
func TestFrameQueueBatches(t *testing.T) {
	half, over := strings.Repeat("x", CarryBatchBytes/2), strings.Repeat("x", CarryBatchBytes+1)
	tests := []struct {
		name    string
		queue   func() *FrameQueue[*wrapperspb.StringValue]
		frames  []string
		batches []int
	}{
		{"small frames go together", NewFrameQueue[*wrapperspb.StringValue], []string{"a", "b", "c"}, []int{3}},
		{"a batch ends before the byte bound", NewFrameQueue[*wrapperspb.StringValue], []string{half, half, "z"}, []int{1, 2}},
		{"a frame over the bound goes alone", NewFrameQueue[*wrapperspb.StringValue], []string{over, "z"}, []int{1, 1}},
		{"a handle queue has no byte bound", NewHandleQueue[*wrapperspb.StringValue], []string{half, half, over, "z"}, []int{4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.queue()
			for _, f := range tt.frames {
				require.NoError(t, o.Put(wrapperspb.String(f)))
			}
			ctx, cancel := context.WithCancelCause(context.Background())
			var got []int
			var sent []string
			done := errors.New("done")
			err := o.Run(ctx, func(batch []*wrapperspb.StringValue) error {
				got = append(got, len(batch))
				for _, f := range batch {
					sent = append(sent, f.GetValue())
				}
				if len(sent) == len(tt.frames) {
					cancel(done)
				}
				return nil
			})
			require.ErrorIs(t, err, done)
			require.Equal(t, tt.batches, got)
			require.Equal(t, tt.frames, sent, "in order")
			require.ErrorIs(t, o.Put(wrapperspb.String("late")), done, "refused once Run returned")
		})
	}
}

// TestFrameQueueOverflow: a peer that does not take frames fails the queue
// at CarryQueue, and Run returns why.
func TestFrameQueueOverflow(t *testing.T) {
	o := NewFrameQueue[*wrapperspb.StringValue]()
	for range CarryQueue {
		require.NoError(t, o.Put(wrapperspb.String("f")))
	}
	require.ErrorIs(t, o.Put(wrapperspb.String("f")), ErrFramesBacklog)
	err := o.Run(context.Background(), func([]*wrapperspb.StringValue) error {
		t.Fatal("nothing is sent from a failed queue")
		return nil
	})
	require.ErrorIs(t, err, ErrFramesBacklog)
}

// TestFrameQueueSendFails: a failed send ends Run with its error.
func TestFrameQueueSendFails(t *testing.T) {
	o := NewFrameQueue[*wrapperspb.StringValue]()
	require.NoError(t, o.Put(wrapperspb.String("f")))
	broken := errors.New("broken pipe")
	err := o.Run(context.Background(), func([]*wrapperspb.StringValue) error { return broken })
	require.ErrorIs(t, err, broken)
	require.ErrorIs(t, o.Put(wrapperspb.String("g")), broken)
}
