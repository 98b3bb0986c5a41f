package wire

// MaxRelayedChain bounds the certificates a relay may forward for one
// agent (rdzv.v1.OpenStream.certificate_chain): a leaf and intermediates.
// rdzv's own CA issues leaves directly, so two is plenty; the bound keeps
// a relay from making the controller parse a long list.
const MaxRelayedChain = 4
