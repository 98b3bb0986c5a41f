package client

import (
	"maps"
	"slices"
)

// Dialled lists the addresses c holds a connection to.
func Dialled(c *Client) []string {
	c.conn.mu.Lock()
	defer c.conn.mu.Unlock()
	return slices.Sorted(maps.Keys(c.conn.conns))
}
