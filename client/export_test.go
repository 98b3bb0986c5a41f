package client

import (
	"maps"
	"slices"
	"testing"
	"time"
)

// ShortKeepalive makes framed streams' keepalive ping after every and give
// up after timeout, until the test ends.
func ShortKeepalive(t testing.TB, every, timeout time.Duration) {
	prevEvery, prevTimeout := keepaliveTime, keepaliveTimeout
	keepaliveTime, keepaliveTimeout = every, timeout
	t.Cleanup(func() { keepaliveTime, keepaliveTimeout = prevEvery, prevTimeout })
}

// Dialled lists the addresses c holds a connection to.
func Dialled(c *Client) []string {
	c.conn.mu.Lock()
	defer c.conn.mu.Unlock()
	return slices.Sorted(maps.Keys(c.conn.conns))
}
