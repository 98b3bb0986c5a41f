package wire_test

import (
	"errors"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/wire"
)

// TestQueueTurns: Put starts a writer only when none runs; Next and
// TakeAll end the turn when the queue is empty, and the next Put starts
// one again. A bound refuses an item without failing the queue.
func TestQueueTurns(t *testing.T) {
	type step struct {
		op        string // put, next, takeall, endturn
		v         int
		wantStart bool
		wantErr   error
		wantOK    bool
		wantItems []int
	}
	tests := []struct {
		name  string
		limit int
		steps []step
	}{
		{name: "one writer at a time", steps: []step{
			{op: "put", v: 1, wantStart: true},
			{op: "put", v: 2},
			{op: "next", wantOK: true, wantItems: []int{1}},
			{op: "put", v: 3},
			{op: "next", wantOK: true, wantItems: []int{2}},
			{op: "next", wantOK: true, wantItems: []int{3}},
			{op: "next"}, // turn over
			{op: "put", v: 4, wantStart: true},
		}},
		{name: "takeall in order", steps: []step{
			{op: "put", v: 1, wantStart: true},
			{op: "put", v: 2},
			{op: "takeall", wantItems: []int{1, 2}},
			{op: "put", v: 3},
			{op: "takeall", wantItems: []int{3}},
			{op: "takeall"}, // turn over
			{op: "put", v: 4, wantStart: true},
		}},
		{name: "bounded", limit: 2, steps: []step{
			{op: "put", v: 1, wantStart: true},
			{op: "put", v: 2},
			{op: "put", v: 3, wantErr: wire.ErrQueueFull},
			{op: "next", wantOK: true, wantItems: []int{1}},
			{op: "put", v: 3},
			{op: "takeall", wantItems: []int{2, 3}},
		}},
		{name: "endturn drops what waits", steps: []step{
			{op: "put", v: 1, wantStart: true},
			{op: "put", v: 2},
			{op: "endturn"},
			{op: "put", v: 3, wantStart: true},
			{op: "takeall", wantItems: []int{3}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := wire.NewQueue[int](tt.limit)
			for i, s := range tt.steps {
				switch s.op {
				case "put":
					start, err := q.Put(s.v)
					require.ErrorIs(t, err, s.wantErr, "step %d", i)
					if s.wantErr == nil {
						require.NoError(t, err, "step %d", i)
					}
					require.Equal(t, s.wantStart, start, "step %d", i)
				case "next":
					v, ok := q.Next()
					require.Equal(t, s.wantOK, ok, "step %d", i)
					if ok {
						require.Equal(t, s.wantItems, []int{v}, "step %d", i)
					}
				case "takeall":
					got := q.TakeAll()
					if len(s.wantItems) == 0 {
						require.Empty(t, got, "step %d", i)
					} else {
						require.Equal(t, s.wantItems, got, "step %d", i)
					}
				case "endturn":
					q.EndTurn()
				}
			}
		})
	}
}

// TestQueueFail: Fail returns what waited, refuses every later Put with
// the first failure, and wakes a writer that waits on Wake.
func TestQueueFail(t *testing.T) {
	q := wire.NewQueue[string](0)
	wake := q.Wake()
	_, err := q.Put("a")
	require.NoError(t, err)
	<-wake
	_, err = q.Put("b")
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, q.Take())
	require.Nil(t, q.Take())
	_, err = q.Put("c")
	require.NoError(t, err)

	first, second := errors.New("first"), errors.New("second")
	require.Equal(t, []string{"c"}, q.Fail(first))
	<-wake
	require.Empty(t, q.Fail(second))
	require.ErrorIs(t, q.Err(), first)
	_, err = q.Put("d")
	require.ErrorIs(t, err, first)
	require.Nil(t, q.Take())
}

// TestQueueWakeAfterPut: a Wake made after items queued is signalled
// already.
func TestQueueWakeAfterPut(t *testing.T) {
	q := wire.NewQueue[int](0)
	_, err := q.Put(1)
	require.NoError(t, err)
	<-q.Wake()
	require.Equal(t, []int{1}, q.Take())
}

// TestQueueClose: Close refuses new items, leaves what waits to the
// writer, and returns once the writer's turn ended; with no writer
// running it returns at once.
func TestQueueClose(t *testing.T) {
	closed := errors.New("closed")
	q := wire.NewQueue[int](0)
	q.Close(closed) // no writer
	_, err := q.Put(1)
	require.ErrorIs(t, err, closed)

	q = wire.NewQueue[int](0)
	start, err := q.Put(1)
	require.NoError(t, err)
	require.True(t, start)
	_, err = q.Put(2)
	require.NoError(t, err)
	release := make(chan struct{})
	var got []int
	done := make(chan struct{})
	go func() { // the writer, blocked in its first write until release
		defer close(done)
		for {
			v, ok := q.Next()
			if !ok {
				return
			}
			<-release
			got = append(got, v)
		}
	}()
	returned := make(chan struct{})
	go func() {
		q.Close(closed)
		close(returned)
	}()
	for q.Err() == nil { // until Close refuses new items
		runtime.Gosched()
	}
	_, err = q.Put(3)
	require.ErrorIs(t, err, closed)
	select {
	case <-returned:
		t.Fatal("Close returned while the writer's turn was under way")
	default:
	}
	close(release)
	<-returned
	<-done
	require.Equal(t, []int{1, 2}, got, "the writer drained what waited before Close")
}

// TestQueueConcurrentProducers: under -race, many producers and writers
// started on demand deliver every item once, and each producer's items in
// its order.
func TestQueueConcurrentProducers(t *testing.T) {
	const producers, each = 8, 500
	q := wire.NewQueue[[2]int](0)
	var mu sync.Mutex
	got := map[int][]int{}
	var writers sync.WaitGroup
	write := func() {
		defer writers.Done()
		for {
			batch := q.TakeAll()
			if batch == nil {
				return
			}
			mu.Lock()
			for _, v := range batch {
				got[v[0]] = append(got[v[0]], v[1])
			}
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				start, err := q.Put([2]int{p, i})
				require.NoError(t, err)
				if start {
					writers.Add(1)
					go write()
				}
			}
		}()
	}
	wg.Wait()
	writers.Wait()
	for p := range producers {
		require.Len(t, got[p], each)
		for i, v := range got[p] {
			require.Equal(t, i, v)
		}
	}
}
