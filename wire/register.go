package wire

import (
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RecvRegister receives an agent stream's first message with recv, which
// must come within d: a stream that opens and says nothing holds its
// server (the controller, or a relay and its stream to the controller)
// for no longer. A message refused as invalid keeps its status, so the
// agent sees what it did wrong.
func RecvRegister[T any](recv func() (T, error), d time.Duration) (T, error) {
	type result struct {
		m   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		m, err := recv()
		ch <- result{m, err}
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	var none T
	select {
	case r := <-ch:
		if status.Code(r.err) == codes.InvalidArgument {
			return none, r.err
		}
		if r.err != nil {
			return none, status.Errorf(codes.Canceled, "agent stream closed before register: %v", r.err)
		}
		return r.m, nil
	case <-t.C:
		return none, status.Errorf(codes.DeadlineExceeded, "no register message within %s", d)
	}
}
