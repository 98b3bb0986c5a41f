package controller

import "context"

// Settle waits until everything the controller decided so far is durable
// in etcd, for tests that read etcd directly after seeing a state through
// the API (which shows decisions as soon as they are made).
func (c *Controller) Settle(ctx context.Context) error {
	c.mu.Lock()
	reply := make(chan error, 1)
	c.queueWrite(pendingWrite{reply: reply})
	c.mu.Unlock()
	return await(ctx, reply)
}
