/* A libfabric provider that stands in for a fabric NIC on machines without
 * one: libfabric loads it from FI_PROVIDER_PATH (as lib<name>-fi.so), and
 * fi_getinfo then reports provider <name> with one domain, <name>0, as
 * it would on a node with the real NIC. It opens nothing: `torch-mojo
 * doctor` only needs to see that the NIC is there. Build (linked with
 * libfabric, whose fi_dupinfo it calls: a process may have loaded libfabric
 * without making its symbols global):
 *   cc -shared -fPIC -DPROVIDER_NAME='"cxi"' -o libcxi-fi.so stand_in_provider.c -l:libfabric.so.1
 */
#include <stdlib.h>
#include <string.h>

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <rdma/providers/fi_prov.h>

static int get_info(uint32_t version, const char *node, const char *service, uint64_t flags,
                    const struct fi_info *hints, struct fi_info **info) {
  (void)version, (void)node, (void)service, (void)flags, (void)hints;
  struct fi_info *entry = fi_allocinfo();
  if (entry == NULL) return -FI_ENOMEM;
  entry->caps = FI_MSG | FI_TAGGED | FI_RMA;
  entry->addr_format = FI_FORMAT_UNSPEC;
  entry->ep_attr->type = FI_EP_RDM;
  entry->domain_attr->name = strdup(PROVIDER_NAME "0");
  entry->fabric_attr->name = strdup(PROVIDER_NAME);
  entry->fabric_attr->prov_version = FI_VERSION(1, 0);
  *info = entry;
  return 0;
}

static int open_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context) {
  (void)attr, (void)fabric, (void)context;
  return -FI_ENOSYS;
}

static void clean_up(void) {}

static struct fi_provider provider = {
    .version = FI_VERSION(1, 0),
    .fi_version = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION),  /* fi_getinfo skips older ones */
    .name = PROVIDER_NAME,
    .getinfo = get_info,
    .fabric = open_fabric,
    .cleanup = clean_up,
};

struct fi_provider *fi_prov_ini(void) { return &provider; }
