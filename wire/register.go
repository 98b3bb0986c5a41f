package wire

import (
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// RecvRegister receives an agent stream's first message with recv, which
// must be a register and come within d: a stream that opens and says
// nothing holds its server (the controller, or a relay and its place on
// the controller) for no longer. A message refused as invalid keeps its
// status, so the agent sees what it did wrong.
func RecvRegister(recv func() (*rdzvv1.ConnectRequest, error), d time.Duration) (*rdzvv1.Register, error) {
	type result struct {
		m   *rdzvv1.ConnectRequest
		err error
	}
	ch := make(chan result, 1)
	go func() {
		m, err := recv()
		ch <- result{m, err}
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case r := <-ch:
		if status.Code(r.err) == codes.InvalidArgument {
			return nil, r.err
		}
		if r.err != nil {
			return nil, status.Errorf(codes.Canceled, "agent stream closed before register: %v", r.err)
		}
		reg := r.m.GetRegister()
		if reg == nil {
			return nil, status.Error(codes.InvalidArgument, "the first message on an agent stream must be register")
		}
		return reg, nil
	case <-t.C:
		return nil, status.Errorf(codes.DeadlineExceeded, "no register message within %s", d)
	}
}
