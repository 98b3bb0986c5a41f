package controller

import (
	"bytes"
	"fmt"
	"unique"

	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/controller/store"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// nodeInfo is a node's registration as the controller keeps it: the fields
// its decisions read (placement, gossip, filters, summaries), and the whole
// registration encoded, decoded only for the API and for writing the node
// record. Decoded, an 8-GPU node with ten interfaces is some twenty
// messages with their strings, maps and slices, about a third of what the
// controller holds per node; encoded it is about 1.4 KB. A nodeInfo is never changed, only
// replaced; its zero value is a registration with nothing in it.
type nodeInfo struct {
	name, address, ncclInterface, gossipAddr, peerAddr string
	labels                                             map[string]string
	// gpuIndices are the node's GPUs as placement hands them out.
	gpuIndices []uint32
	// encoded is the NodeInfo, deterministically: equal registrations
	// encode to equal bytes.
	encoded []byte
}

var deterministic = proto.MarshalOptions{Deterministic: true}

// newNodeInfo keeps info compactly. Strings most nodes share (the NCCL
// interface, labels) share their bytes with every other node's: unique
// holds its copies weakly, so nothing is kept for nodes that are gone.
func newNodeInfo(info *rdzvv1.NodeInfo) (nodeInfo, error) {
	encoded, err := deterministic.Marshal(info)
	if err != nil {
		return nodeInfo{}, fmt.Errorf("encoding the registration of node %s: %w", info.GetName(), err)
	}
	ni := nodeInfo{
		name: info.GetName(), address: info.GetAddress(), gossipAddr: info.GetGossipAddr(), peerAddr: info.GetPeerAddr(),
		ncclInterface: internString(info.GetNcclInterface()), encoded: encoded,
	}
	if len(info.GetLabels()) > 0 {
		ni.labels = make(map[string]string, len(info.GetLabels()))
		for k, v := range info.GetLabels() {
			ni.labels[internString(k)] = internString(v)
		}
	}
	if len(info.GetGpus()) > 0 {
		ni.gpuIndices = make([]uint32, len(info.GetGpus()))
		for i, g := range info.GetGpus() {
			ni.gpuIndices[i] = g.GetIndex()
		}
	}
	return ni, nil
}

func internString(s string) string { return unique.Make(s).Value() }

// same says whether info, deterministically encoded, is the registration
// kept: a reconnecting agent's node is written again only if not.
func (ni nodeInfo) same(encoded []byte) bool { return bytes.Equal(ni.encoded, encoded) }

// decode is the registration in full, a message of the caller's own.
func (ni nodeInfo) decode() *rdzvv1.NodeInfo {
	info := &rdzvv1.NodeInfo{}
	if err := proto.Unmarshal(ni.encoded, info); err != nil {
		// Unreachable: the bytes are this process's own encoding of a
		// message. Show what is known rather than nothing.
		return &rdzvv1.NodeInfo{Name: ni.name, Address: ni.address, NcclInterface: ni.ncclInterface, GossipAddr: ni.gossipAddr, PeerAddr: ni.peerAddr, Labels: ni.labels}
	}
	return info
}

// putNode makes rec ns's record, and the change that writes it with info,
// ns's registration in full: ns keeps it apart, compactly (nodeInfo), and
// rec, once written, without it.
func putNode(st *store.Store, ns *nodeState, rec *rdzvv1.Node, info *rdzvv1.NodeInfo, events ...*rdzvv1.Event) *store.Change {
	rec.Info = info
	ch := st.PutNode(rec, events...)
	rec.Info = nil
	ns.rec = rec
	return ch
}
