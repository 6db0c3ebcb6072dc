# Installation and the Debian package (`cmake --install`, `cpack -G DEB`).
#
# Installs the `ballast` binary, the example configs (share/ballast/configs;
# the package's postinst copies node.yaml and scheduler.yaml to
# /etc/ballast when absent), the systemd units, the README and the
# Kubernetes manifests.
# The package's dependencies are the Debian runtime libraries the binary
# links, found by dpkg-shlibdeps; scripts/check-package.sh (CI stage
# package) builds it and checks its contents and dependencies.
include(GNUInstallDirs)

install(FILES configs/node.yaml configs/scheduler.yaml configs/ballast.yaml configs/gpu.yaml
              configs/real-model.yaml
        DESTINATION ${CMAKE_INSTALL_DATADIR}/ballast/configs)
install(DIRECTORY deploy/kubernetes DESTINATION ${CMAKE_INSTALL_DATADIR}/ballast)
install(FILES deploy/prometheus/alerts.yaml DESTINATION ${CMAKE_INSTALL_DATADIR}/ballast/prometheus)
install(FILES deploy/grafana/ballast.json DESTINATION ${CMAKE_INSTALL_DATADIR}/ballast/grafana)
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES deploy/systemd/ballast-node.service deploy/systemd/ballast-scheduler.service
        DESTINATION lib/systemd/system)

set(CPACK_PACKAGE_NAME ballast)
set(CPACK_PACKAGE_VENDOR "Ballast")
set(CPACK_PACKAGE_CONTACT "Ballast maintainers <ballast@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Multi-model LLM serving daemon with elastic GPU memory (scheduler and node)")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "passwd")  # useradd, in postinst
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_SOURCE_DIR}/deploy/packaging/postinst)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
