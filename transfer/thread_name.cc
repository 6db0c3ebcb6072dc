#include "transfer/thread_name.h"

#include <pthread.h>

#include <string>

namespace ballast::transfer {

void NameThisThread(std::string_view name) {
  const std::string cut(name.substr(0, kMaxThreadName));
  pthread_setname_np(pthread_self(), cut.c_str());
}

}  // namespace ballast::transfer
