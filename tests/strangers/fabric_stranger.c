/* A process outside a job that sends well-formed tagged messages to its
 * libfabric endpoints, claiming to be its ranks: what a rank left over from
 * an earlier job, or another user's process, could send. For each target
 * address and claimed rank it sends messages tagged as libmojoccl tags them
 * (the sender's rank above a 28-bit counter), counters 0..COUNTERS-1, over
 * and over until SECONDS pass, each message SIZE bytes of float32 1e6 and
 * with remote completion data of its own (a key that is not the job's).
 * Targets that refuse or vanish are skipped; it never fails on them.
 *
 *   cc -o fabric_stranger fabric_stranger.c -l:libfabric.so.1
 *   fabric_stranger PROVIDER SECONDS RANKS COUNTERS SIZE HOST:PORT...
 *
 * Prints "sent N" at the end. Over `tcp` (ofi_rxm) and `net` an endpoint's
 * address is its listening socket's sockaddr_in. ofi_rxm refuses
 * connections whose eager limit differs from its own: run it with the
 * job's FI_OFI_RXM_EAGER_LIMIT. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Reads the completions there are; returns how many sends they end. */
static long drain(struct fid_cq *cq) {
  struct fi_cq_tagged_entry entries[64];
  ssize_t count;
  long ended = 0;
  while ((count = fi_cq_read(cq, entries, 64)) > 0 || count == -FI_EAVAIL) {
    if (count == -FI_EAVAIL) {
      struct fi_cq_err_entry error = {0};
      fi_cq_readerr(cq, &error, 0);
      count = 1;
    }
    ended += count;
  }
  return ended;
}

int main(int argc, char **argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: %s PROVIDER SECONDS RANKS COUNTERS SIZE HOST:PORT...\n", argv[0]);
    return 2;
  }
  const char *provider = argv[1];
  const double seconds = atof(argv[2]);
  const int ranks = atoi(argv[3]), counters = atoi(argv[4]);
  const size_t size = strtoul(argv[5], NULL, 10);
  const int targets = argc - 6;

  struct fi_info *hints = fi_allocinfo(), *info = NULL;
  hints->caps = FI_TAGGED;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->fabric_attr->prov_name = strdup(provider);
  if (fi_getinfo(FI_VERSION(1, 10), NULL, NULL, 0, hints, &info) != 0) {
    fprintf(stderr, "no %s provider\n", provider);
    return 1;
  }
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_cq *cq;
  struct fid_av *av;
  struct fid_ep *ep;
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED, .size = 4096};
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
  if (fi_fabric(info->fabric_attr, &fabric, NULL) || fi_domain(fabric, info, &domain, NULL) ||
      fi_cq_open(domain, &cq_attr, &cq, NULL) || fi_av_open(domain, &av_attr, &av, NULL) ||
      fi_endpoint(domain, info, &ep, NULL) || fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) ||
      fi_ep_bind(ep, &av->fid, 0) || fi_enable(ep)) {
    fprintf(stderr, "could not open a %s endpoint\n", provider);
    return 1;
  }

  fi_addr_t *addresses = calloc(targets, sizeof(fi_addr_t));
  for (int i = 0; i < targets; ++i) {
    char host[64];
    int port = 0;
    struct sockaddr_in address = {.sin_family = AF_INET};
    if (sscanf(argv[6 + i], "%63[^:]:%d", host, &port) != 2 || inet_pton(AF_INET, host, &address.sin_addr) != 1) {
      fprintf(stderr, "bad target %s\n", argv[6 + i]);
      return 2;
    }
    address.sin_port = htons(port);
    if (fi_av_insert(av, &address, 1, &addresses[i], 0, NULL) != 1) addresses[i] = FI_ADDR_NOTAVAIL;
  }

  float *payload = malloc(size > 0 ? size : 1);
  for (size_t i = 0; i < size / sizeof(float); ++i) payload[i] = 1e6f;
  struct fi_context2 *contexts = calloc(1024, sizeof(struct fi_context2));
  const uint64_t not_the_key = 0x5354524e47455221ull;  /* "STRNGER!" */
  unsigned long sent = 0;
  long in_flight = 0; /* sends whose contexts libfabric still holds: at most 1024 */
  const double end = now() + seconds;
  while (now() < end) {
    for (int counter = 0; counter < counters && now() < end; ++counter)
      for (int rank = 0; rank < ranks; ++rank)
        for (int i = 0; i < targets; ++i) {
          if (addresses[i] == FI_ADDR_NOTAVAIL) continue;
          const uint64_t tag = ((uint64_t)rank << 28) | (uint64_t)counter;
          const int inject = size <= info->tx_attr->inject_size;
          in_flight -= drain(cq);
          if (!inject && in_flight >= 1024) continue;
          ssize_t result = inject ? fi_tinjectdata(ep, payload, size, not_the_key, addresses[i], tag)
                                  : fi_tsenddata(ep, payload, size, NULL, not_the_key, addresses[i], tag,
                                                 &contexts[sent % 1024]);
          if (result == 0) ++sent, in_flight += !inject;
        }
  }
  printf("sent %lu\n", sent);
  fflush(stdout);
  /* The endpoint's close may wait on targets that are gone: exit at once. */
  _exit(0);
}
