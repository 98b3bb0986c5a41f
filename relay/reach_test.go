package relay

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestReach(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	unreachable := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)}
	tests := []struct {
		name string
		// answers is each controller's answer to a dial: nil accepts.
		answers []error
		want    bool
	}{
		{"accepts", []error{nil}, true},
		{"refuses: its process is down", []error{refused}, true},
		{"no answer in time", []error{context.DeadlineExceeded}, false},
		{"no route", []error{unreachable}, false},
		{"one of three answers", []error{unreachable, context.DeadlineExceeded, refused}, true},
		{"none of two answers", []error{unreachable, context.DeadlineExceeded}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var addrs []string
			answer := map[string]error{}
			for i, err := range tt.answers {
				addr := fmt.Sprintf("10.0.0.%d:7070", i+1)
				addrs = append(addrs, addr)
				answer[addr] = err
			}
			var dials atomic.Int32
			r := &reach{addrs: addrs, dial: func(_ context.Context, _, addr string) (net.Conn, error) {
				dials.Add(1)
				if err := answer[addr]; err != nil {
					return nil, err
				}
				client, server := net.Pipe()
				_ = server.Close()
				return client, nil
			}}
			require.Equal(t, tt.want, r.reachable(context.Background()))
			require.Equal(t, tt.want, r.reachable(context.Background()), "the answer stands for probeEvery")
			require.Equal(t, int32(len(addrs)), dials.Load(), "one probe of each controller, shared")
		})
	}
}
