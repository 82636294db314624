// fusekit: symbol visibility for the shared library.
#ifndef FUSEKIT_EXPORT_H_
#define FUSEKIT_EXPORT_H_

#define FUSEKIT_API __attribute__((visibility("default")))

#endif  // FUSEKIT_EXPORT_H_
