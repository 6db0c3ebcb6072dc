// The lifecycle of a model on a node, as the node reports it to the
// scheduler (ResidentModel.state):
//
//   LOADING ──▶ READY ──▶ DRAINING ──▶ (gone; host copy kept: EVICTED)
//      │                      ▲
//      └── load failed ──▶ (gone)       READY ──▶ (gone) on a hard evict
//
//   LOADING   weight pages are reserved (KV reclaimed if needed) and the
//             weights copied in, from the pinned host copy when the node
//             keeps one, else from the checkpoint. Not routable.
//   READY     serving.
//   DRAINING  being evicted or migrated away: takes no new requests (the
//             scheduler stops routing to it); in-flight requests finish
//             here, then the model is dropped.
//   EVICTED   not resident; the node keeps a host copy of its weights (in
//             its DRAM budget) so the next activation is a copy. Reported
//             in the node's host_copies, not as a resident model.
//
// The states are v1::ModelState (proto/ballast/v1/inference.proto), the
// one lifecycle enum both processes use; ModelStateLabel (proto/
// model_state.h) names them for logs.
#pragma once

#include "ballast/v1/inference.pb.h"
#include "proto/model_state.h"
